// The training loop: micro-batches of fixture data (fixtures/), the target
// forward, the optimized (or reference) step, gradient accumulation with the
// loss normalised globally (numerators and weight sums added over every
// micro-batch and drafter rank before dividing, SPEC.md step 9), clipping by
// the global norm and AdamW.
//
// Micro-batch g = t * D + d is optimizer step t's d-th (D micro-batches per
// step). In one process the D micro-batches run one after another; in the
// split, target rank (g mod T) builds it, runs the target and sends it to
// drafter rank d, and every drafter rank ends the step with the same
// parameters.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/optim.h"
#include "core/step.h"
#include "dist/cluster.h"

namespace dflash::dist {

struct StepLog {
  int64_t step;
  double loss, weight_sum, grad_norm, lr, tau;
  double wait_seconds, step_seconds;  // time waiting for target data, whole step
};

// Where the split's data comes from and where its state goes. Unset hooks
// mean the fixture target and batches, no resume, a printed line per step
// (the bench and the tests); train/loop.cpp sets them from the config's data,
// target and run directory.
struct SplitHooks {
  int64_t start_step = 0;  // resume: every rank starts at micro-batch start_step * D
  // Target rank: micro-batch g with the target's outputs (anchors unset).
  std::function<StepInputs(int64_t g)> micro_batch;
  // Drafter ranks: the frozen embedding / LM head, and the resumed state.
  std::function<FrozenWeights()> frozen;
  std::function<void(DrafterWeights&, AdamW&)> resume;
  // Drafter ranks: before each step (test hooks), and when any drafter's
  // loss or gradients are non-finite, on the ranks whose own micro-batch is
  // (writes a dump, throws naming the tensor); the others then stop too.
  std::function<void(int64_t t, DrafterWeights&)> before_step;
  std::function<void(int64_t t, int64_t g, const StepInputs&, const DrafterWeights&)> nonfinite;
  // Drafter rank 0 only: once the ranks have met, after every step
  // (metrics, evaluation, checkpoints) and at the end.
  std::function<void()> at_start;
  std::function<void(const StepLog&, const DrafterWeights&, const AdamW&)> after_step;
  std::function<void(const DrafterWeights&, const AdamW&)> at_end;
  // Drafter rank 0 only: the drafters agreed to stop on signal `sig` after
  // the step just done (after_step has run): its checkpoint, written before
  // any rank exits.
  std::function<void(const DrafterWeights&, const AdamW&, int sig)> at_stop;
};

struct TrainOptions {
  int64_t steps = 1;
  int64_t micro_batches = 0;  // per optimizer step; 0: one per drafter rank
  std::string build = "optimized";
  OptimConfig optim;
  std::string out_params;  // write the final drafter parameters (safetensors)
  // Bug-zoo hook: each drafter normalises its loss by its own weight sum and
  // the ranks' gradients are averaged (SPEC.md's per-rank normalisation bug).
  bool per_rank_normalisation = false;
  // Test hook for faults, "rank=R,step=T,mode=exit|hang".
  std::string fault;
  // SIGTERM / SIGINT (core/signals.h) on any drafter rank
  // stops every rank after the same step (docs/DISTRIBUTED.md, "Stopping").
  bool stop_on_signal = false;
  SplitHooks hooks;
};

// `stopped` (optional): the signal the ranks stopped on, 0 when they finished.
std::vector<StepLog> train_distributed(const Config& c, const TrainOptions& o, dist::Cluster& cl,
                                       int* stopped = nullptr);

// `dflash train` inside a launched rank (RANK / WORLD_SIZE > 1); one
// process trains through train::run_training (train/loop.h). Checks the
// launcher's environment against the config, joins the ranks (config hash
// compared) and trains. On CUDA every rank computes on its device and the
// transfers and collectives go through host copies over gloo (no NCCL groups
// yet). The gradient accumulation is core's (zero_grads, scale_grads, the
// same as the single-process loop's), so both normalise identically.
int run_train(const Config& c, const TrainOptions& o);

// `dflash bench --dist` inside a launched rank (dist/throughput.cpp).
int run_dist_bench(const Config& c);

}  // namespace dflash::dist
