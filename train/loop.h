// `dflash train`: the full training run (docs/TRAINING.md).
//
// preflight gate -> data and target -> [resume] -> steps of D micro-batches
// (gradient accumulation, loss normalised by the global weight sum) -> clip,
// AdamW (fp32 masters, warmup then cosine) -> progress line, metrics.jsonl,
// periodic held-out evaluation (loss, per-slot accuracy, tau) and atomic
// checkpoints -> report.html. A non-finite loss or gradient stops the run
// with a step dump (dflash step --from) naming the first non-finite tensor.
// SIGTERM / SIGINT stop it between steps with a checkpoint of the step just
// finished (exit 128 + signal; --resume continues bit-exactly).
// Launched with RANK / WORLD_SIZE > 1 it runs the target/drafter split
// (dist/split_loop.h) instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace dflash::train {

struct RunOptions {
  std::string config;
  std::vector<std::string> set;  // --set KEY=VALUE config overrides, in order
  int64_t steps = 0;             // 0: train.steps
  int64_t micro_batches = 0;     // 0: train.micro_batches (split: one per drafter rank)
  double lr = 0;                 // 0: train.lr
  std::string out_dir;           // "": train.out_dir, else runs/<config file stem>
  std::string build = "optimized";
  bool resume = false;
  bool skip_preflight = false;
  int preflight_cases = 25;
  std::string out_params;  // also write the final drafter parameters here
  std::string device;      // "": topology.device, else cpu | cuda | cuda:N
  std::string init_from;   // start from this drafter directory (dflash, zlab, speculators)
  // Test hooks: a NaN written into fc.weight before this step (1-based);
  // the split's per-rank-normalisation mutant and fault injection.
  int64_t poison_step = 0;
  bool per_rank_normalisation = false;
  std::string fault;
};

struct RunSummary {
  std::string run_dir, report;
  int64_t steps = 0;
  double first_eval_tau = 0, last_eval_tau = 0;
  double first_served = 0, last_served = 0;  // served acceptance (0: not measured)
  int signal = 0;  // SIGTERM / SIGINT that stopped the run after a checkpoint (0: it finished)
};

// The config with the command-line overrides applied and re-validated.
Config resolve_config(const RunOptions& o);

// The single-process run after the gate (tests call it directly).
RunSummary train_run(const Config& c, const RunOptions& o);

// The whole command: gate, run (single or split), report.
int run_training(const RunOptions& o);

}  // namespace dflash::train
