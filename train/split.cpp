// The target/drafter split as a training run (docs/DISTRIBUTED.md): target
// ranks read the config's data and run its target; every drafter resumes
// from the same checkpoint; drafter rank 0 writes metrics, evaluates,
// checkpoints and writes the report, like the single-process loop.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/safetensors.h"
#include "core/signals.h"
#include "dist/split_loop.h"
#include "models/checkpoint.h"
#include "train/loop.h"
#include "train/report.h"
#include "train/run_state.h"

namespace dflash::train::detail {
namespace fs = std::filesystem;
namespace {

bool has_rank(const std::vector<int64_t>& ranks, int64_t r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

// The launcher's verdict (DFLASH_PREFLIGHT_PASSED names its JSON), or a
// record that the gate was skipped, beside the run.
void record_verdict(const Config& c, const RunOptions& o, const std::string& dir) {
  const char* v = std::getenv("DFLASH_PREFLIGHT_PASSED");
  const fs::path out = fs::path(dir) / "preflight.json";
  if (!o.skip_preflight && v && fs::exists(v)) {
    fs::copy_file(v, out, fs::copy_options::overwrite_existing);
    return;
  }
  const nlohmann::json j = {{"config", c.path},
                            {"passed", nullptr},
                            {"skipped", o.skip_preflight},
                            {"checks", nlohmann::json::array()}};
  safetensors::write_file_atomic(out.string(), j.dump(2) + "\n");
}

void split_progress(Run& r, const dist::StepLog& l) {
  append_metrics(r, {{"kind", "train"},
                     {"step", r.st.step},
                     {"loss", l.loss},
                     {"tau", l.tau},
                     {"weight_sum", l.weight_sum},
                     {"grad_norm", l.grad_norm},
                     {"lr", l.lr},
                     {"tokens_per_s", r.tokens_per_step / l.step_seconds},
                     {"wait_s", l.wait_seconds},
                     {"step_s", l.step_seconds}});
  if (!line_due(r)) return;
  fmt::print(
      "step {:>5}  loss {:.8f}  tau {:.3f}  lr {:.3e}  grad_norm {:.3e}  {:.0f} tok/s  "
      "wait {:.3f}s of {:.3f}s\n",
      r.st.step, l.loss, l.tau, l.lr, l.grad_norm, r.tokens_per_step / l.step_seconds,
      l.wait_seconds, l.step_seconds);
  std::fflush(stdout);
}

// Drafter rank 0: once the ranks have met (every rank's inputs checked), the
// run directory, step-0 evaluation; then metrics, evaluation, checkpoints
// and the report.
void report_hooks(Run* run, const RunOptions& o, int64_t D, dist::SplitHooks& h) {
  auto saved = std::make_shared<bool>(false);
  h.at_start = [run, o] {
    fs::create_directories(run->dir);
    record_verdict(run->c, o, run->dir);
    begin_run(*run);
  };
  h.after_step = [run, D, saved](const dist::StepLog& l, const DrafterWeights& w,
                                 const AdamW& opt) {
    run->st.step = l.step + 1, run->st.cursor = run->st.step * D;
    run->w = w;  // the same tensors, for evaluation and checkpoints
    split_progress(*run, l);
    *saved = after_step(*run, opt);
  };
  h.at_end = [run, saved](const DrafterWeights& w, const AdamW& opt) {
    run->w = w;
    fmt::print("report: {}\n", end_run(*run, opt, *saved).second);
  };
  h.at_stop = [run, saved](const DrafterWeights& w, const AdamW& opt, int sig) {
    run->w = w;
    const std::string ck =
        *saved ? (fs::path(run->dir) / "checkpoints" / fmt::format("step-{:06d}", run->st.step))
                     .string()
               : models::save_checkpoint(run->dir, run->c, run->w, opt, run->st);
    run->metrics.close();
    fmt::print(stderr,
               "dflash train: stopped by {} after step {} of {} (every rank stops after it); "
               "checkpoint {} is complete\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", run->st.step, run->c.train.steps, ck);
    std::fflush(stderr);
  };
}

// Test hook: DFLASH_TEST_SIGNAL_LAUNCHER_IN_STEP=<step>[,int] sends SIGTERM
// (SIGINT) to the launcher (this rank's parent) at the start of that step
// (1-based), as a cluster scheduler would.
void maybe_signal_launcher(int64_t step) {
  const char* s = std::getenv("DFLASH_TEST_SIGNAL_LAUNCHER_IN_STEP");
  if (!s || std::atoll(s) != step) return;
  kill(getppid(), std::string(s).find(",int") != std::string::npos ? SIGINT : SIGTERM);
}

// Every drafter: the same resumed state, the test poison, the non-finite dump.
void drafter_hooks(Run* run, int64_t rank, bool reporter, dist::SplitHooks& h) {
  h.frozen = [run] { return run->frozen; };
  h.resume = [run](DrafterWeights& w, AdamW& opt) { w = run->w, opt = *run->opt; };
  run->dump_suffix = fmt::format("-rank-{}", rank);
  h.nonfinite = [run](int64_t t, int64_t g, const StepInputs& in, const DrafterWeights& w) {
    run->w = w, run->st.step = t;
    stop_nonfinite(*run, in, g);
  };
  if (reporter)
    h.before_step = [run](int64_t t, DrafterWeights& w) {
      maybe_signal_launcher(t + 1);
      if (run->o.poison_step <= 0 || t + 1 != run->o.poison_step) return;
      at::NoGradGuard ng;
      w.fc.view(-1)[0] = NAN;
    };
}

}  // namespace

int run_split(const Config& c, const RunOptions& o) {
  // SIGTERM / SIGINT: the drafters agree on a step, checkpoint it, and every
  // rank exits 128 + signal (docs/DISTRIBUTED.md, "Stopping").
  install_rank_stop_handlers();
  if (!o.skip_preflight && !std::getenv("DFLASH_PREFLIGHT_PASSED"))
    throw std::runtime_error(
        "a launched rank does not run preflight itself: start the split with `dflash launch` "
        "(which runs it once before spawning the ranks), or run `dflash preflight` first and "
        "pass --skip-preflight to every rank");
  const char* rank_env = std::getenv("RANK");
  const int64_t rank = rank_env ? std::atoll(rank_env) : 0;
  const TopologyConfig& tp = c.topology;
  const bool target = has_rank(tp.target_ranks, rank), drafter = has_rank(tp.drafter_ranks, rank);
  const bool reporter = !tp.drafter_ranks.empty() && tp.drafter_ranks[0] == rank;
  const int64_t D = int64_t(tp.drafter_ranks.size());
  if (o.micro_batches > 0 && o.micro_batches != D)
    throw std::runtime_error(fmt::format(
        "--micro-batches {} but the topology has {} drafter ranks (one micro-batch per drafter "
        "per step)",
        o.micro_batches, D));
  Config cs = c;
  cs.train.micro_batches = D;  // what a step is here; recorded in checkpoints
  // Every input checked on every rank before the ranks meet. Target ranks and
  // drafter 0 (evaluation) load the target and data; other drafters only
  // the frozen embedding and LM head. Without target ranks (features) every
  // drafter reads the data.
  const bool readers = tp.target_ranks.empty();
  std::unique_ptr<Run> r = prepare(cs, o, target || reporter || readers, target || reporter);
  dist::TrainOptions t;
  t.steps = cs.train.steps;
  t.micro_batches = D;
  t.build = o.build;
  t.optim = optim_config(cs.train);
  t.out_params = o.out_params;
  t.per_rank_normalisation = o.per_rank_normalisation;
  t.fault = o.fault;
  t.stop_on_signal = true;
  Run* run = r.get();
  t.hooks.start_step = run->st.step;
  if (target || readers)
    t.hooks.micro_batch = [run](int64_t g) {
      return inputs_of(*run, data::train_batch(run->c, run->data.train, g), "anchors", g);
    };
  if (drafter) drafter_hooks(run, rank, reporter, t.hooks);
  if (reporter) report_hooks(run, o, D, t.hooks);
  return dist::run_train(cs, t);
}

}  // namespace dflash::train::detail
