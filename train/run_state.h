// The training run's state and steps, shared by the single-process loop
// (loop.cpp) and the target/drafter split (split.cpp). Internal to train/.
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/optim.h"
#include "core/step.h"
#include "data/data.h"
#include "models/checkpoint.h"
#include "train/loop.h"
#include "train/tensorboard.h"

namespace dflash::train::detail {

struct Sums {
  double num = 0, den = 0, ce = 0, kl = 0, reverse_kl = 0, jsd = 0, tv = 0, accept = 0, kept = 0;
  at::Tensor correct, counted;  // (bs) int64
  void add(const StepOutputs& out) {
    const double d = out.weight_sum.item<double>();
    num += out.loss.item<double>() * d, den += d;
    ce += out.ce_sum.item<double>(), kl += out.kl_sum.item<double>();
    reverse_kl += out.reverse_kl_sum.item<double>(), jsd += out.jsd_sum.item<double>(),
        tv += out.tv_sum.item<double>();
    accept += double(out.accept_sum.item<int64_t>()),
        kept += double(out.kept_blocks.item<int64_t>());
    correct = correct.defined() ? correct + out.correct : out.correct.clone();
    counted = counted.defined() ? counted + out.counted : out.counted.clone();
  }
  double loss() const { return den > 0 ? num / den : 0.0; }
  double per_weight(double sum) const { return den > 0 ? sum / den : 0.0; }
  double tau() const { return kept > 0 ? 1.0 + accept / kept : 1.0; }
  std::vector<double> accuracy() const {
    std::vector<double> a;
    for (int64_t k = 0; correct.defined() && k < correct.size(0); ++k) {
      const int64_t n = counted[k].item<int64_t>();
      a.push_back(n > 0 ? double(correct[k].item<int64_t>()) / double(n) : 0.0);
    }
    return a;
  }
};

// Everything a run holds.
struct Run {
  Config c;
  RunOptions o;
  std::string dir;
  TargetWeights target;  // undefined tensors for source = "features"
  FrozenWeights frozen;
  data::DataSplit data;
  DrafterWeights w;
  std::unique_ptr<AdamW> opt;
  StepFn fn;
  models::TrainerState st;
  std::ofstream metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;  // train.report_to = "tensorboard"
  double tokens_per_step = 0;
  bool resumed = false;
  std::vector<std::string> damaged;    // --resume: newer damaged checkpoints, set aside at start
  std::string dump_suffix;             // the split: "-rank-R", so drafters do not collide
  c10::Device device{c10::kCPU};       // topology.device: weights, optimizer state, batches
  double served = 0, served_tree = 0;  // last served acceptance (block, tree); 0: none yet
};

std::string run_dir_for(const Config& c, const RunOptions& o);
// Loads the target (`with_target`; else only the frozen embedding / LM
// head; with features neither), the data when `with_data`, the drafter init
// and, with --resume, the newest checkpoint; refuses an existing run without
// --resume. Writes nothing.
std::unique_ptr<Run> prepare(const Config& c, const RunOptions& o, bool with_data,
                             bool with_target);
StepInputs inputs_of(const Run& r, const data::MicroBatch& mb, const char* stream, int64_t index);
void open_metrics(Run& r);
void append_metrics(Run& r, const nlohmann::json& j);
bool has_eval(const Run& r);
Sums evaluate(Run& r);
// Served acceptance (docs/EVAL.md) of train.served_eval_prompts held-out
// prompts, block and tree at train.served_tree_budget, into r.served* and
// metrics.jsonl ({"kind": "served"}). Skipped where the process holds no
// target (features data, the split's drafter ranks) or nothing is held out.
void served_evaluate(Run& r);
// Writes the step dump of micro-batch g and throws naming the first
// non-finite tensor.
[[noreturn]] void stop_nonfinite(const Run& r, const StepInputs& in, int64_t g);
// The run directory's config.toml and metrics.jsonl, and the step-0
// held-out evaluation (its tau; 0 when resumed or without held-out data).
double begin_run(Run& r);
// After optimizer step r.st.step (parameters in r.w): evaluation and a
// checkpoint when due; returns whether it checkpointed.
bool after_step(Run& r, const AdamW& opt);
// Final evaluation, a checkpoint unless `saved_now`, the report:
// {held-out tau, report path}.
std::pair<double, std::string> end_run(Run& r, const AdamW& opt, bool saved_now);
void maybe_exit_after(int64_t step);
// A progress line at the first and last step and every train.log_every.
bool line_due(const Run& r);
bool gate(const Config& c, const RunOptions& o, const std::string& dir);
RunSummary run_loop(Run& r);
int run_split(const Config& c, const RunOptions& o);

}  // namespace dflash::train::detail
