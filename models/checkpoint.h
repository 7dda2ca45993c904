// Run checkpoints (docs/TRAINING.md).
//
// RUN/checkpoints/step-000050/
//   model.safetensors      the drafter, SPEC.md names (fc.weight, layers.0...),
//                          fp32 masters; never embed_tokens / lm_head
//   config.json            what DFlash inference code reads: architectures
//                          ["DFlashDraftModel"], block_size, dflash_config
//                          {mask_token_id, target_layer_ids}, Qwen3 fields
//   optimizer.safetensors  AdamW moments (exp_avg.<name>, exp_avg_sq.<name>)
//   trainer_state.json     step, data cursor, RNG scheme, resolved run config
// RUN/checkpoints/latest   name of the newest complete checkpoint
//
// A checkpoint is written into a temporary directory and renamed into place,
// so a run killed at any moment leaves the previous checkpoint whole; the
// reader only ever sees complete step-* directories.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/optim.h"
#include "core/weights.h"

namespace dflash::models {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainerState {
  int64_t step = 0;    // optimizer steps done
  int64_t cursor = 0;  // next training micro-batch index g (the data cursor)
};

// The inference config.json of a drafter trained with `c`.
nlohmann::json drafter_config_json(const Config& c);

// Writes RUN/checkpoints/step-<step>, updates `latest`, keeps the newest
// `keep` checkpoints. Returns the checkpoint directory. A write that fails
// (disk full, I/O error) removes its temporary directory and throws a
// CheckpointError naming it; the previous checkpoints are untouched.
std::string save_checkpoint(const std::string& run_dir, const Config& c, const DrafterWeights& w,
                            const AdamW& opt, const TrainerState& s);

// Newest complete checkpoint under RUN/checkpoints, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

struct Checkpoint {
  std::string dir;
  TrainerState state;
  nlohmann::json config;  // resolved config of the run that wrote it
  int threads = 0;        // intra-op threads of the run that wrote it
  std::string cwd;        // directory the run started in ("" in older checkpoints)
  std::map<std::string, at::Tensor> params, moments;
};
Checkpoint read_checkpoint(const std::string& dir);
// trainer_state.json's text into ck.state, ck.config, ck.threads; `label`
// names the file in messages.
void parse_trainer_state(const std::string& text, const std::string& label, Checkpoint& ck);

// What --resume starts from: the newest checkpoint that reads back whole
// (trainer_state.json and both safetensors files). Newer damaged ones are
// listed ("DIR: reason") for the warning; none at all: nullopt. Throws a
// CheckpointError naming every damaged checkpoint when none is intact.
struct ResumePoint {
  std::optional<Checkpoint> ck;
  std::vector<std::string> damaged_dirs, damaged_reasons;
};
ResumePoint newest_intact_checkpoint(const std::string& run_dir);
// Renames a damaged checkpoint to RUN/checkpoints/damaged-step-<step>-<pid>
// (kept for inspection, never resumed from or pruned); returns the new path.
std::string set_aside_damaged(const std::string& dir);

// Refuses a checkpoint written by a different config (model, data, loss,
// optimizer settings), naming the first differing key. Cadence keys
// (log/eval/checkpoint intervals, out_dir, threads) may change, and so may
// the schedule keys (train.steps, lr, warmup_steps, min_lr_ratio: the
// learning rate continues from the recorded step with the new values;
// train.steps not below that step). Returns the changed schedule keys as
// "key: old -> new".
std::vector<std::string> check_same_run(const Checkpoint& ck, const Config& c);

// Loads parameters and optimizer state in place.
void restore(const Checkpoint& ck, const Config& c, DrafterWeights& w, AdamW& opt);

}  // namespace dflash::models
