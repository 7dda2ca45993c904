// Served acceptance of a drafter (docs/EVAL.md): speculative decoding of a
// set of prompts, block and tree, beside plain greedy decoding and the
// teacher-forced tau of the same drafter on the same texts. Used by
// `dflash eval` and by the training run's served evaluation.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/step.h"
#include "data/data.h"
#include "decode/speculative.h"

namespace dflash::decode {

struct ServedOptions {
  int64_t block_size = 0;        // served block size (<= the trained one)
  int64_t max_new_tokens = 64;   // per prompt
  int64_t max_context = 0;       // the target's context limit (context_limit)
  std::vector<int64_t> budgets;  // tree decoding at each node budget
  bool plain_greedy = true;      // also decode plainly: the speedup and the lossless check
  int64_t stop_token = -1;
};

// One decoding mode over every prompt. Per-round figures count full rounds
// only (the proposal was bs - 1 deep; the last rounds of a prompt near its
// length limit propose less).
struct ServedRun {
  int64_t budget = 0;  // 0: block decoding
  int64_t tokens = 0, rounds = 0, full_rounds = 0, target_forwards = 0, nodes = 0;
  int64_t committed = 0;           // tokens committed by the full rounds (accepted + 1 each)
  std::vector<int64_t> histogram;  // [j]: full rounds committing j + 1 tokens, j < bs
  std::vector<int64_t> reached;    // [k-1]: full rounds accepting slot k, k = 1 .. bs-1
  double target_s = 0, drafter_s = 0, total_s = 0;
  int64_t mismatched_prompts = 0;  // output differing from plain greedy (must be 0)
  double acceptance() const;       // served acceptance length: committed / full_rounds
  nlohmann::json to_json() const;
};

// Adds one prompt's decoding (served with blocks of `block_size`) to `run`.
void add_decode(ServedRun& run, const DecodeResult& r, int64_t block_size);

struct ServedReport {
  int64_t prompts = 0, block_size = 0;
  ServedRun block;
  std::vector<ServedRun> trees;
  int64_t greedy_tokens = 0;
  double greedy_s = 0;               // plain greedy decoding, wall clock (0: not run)
  double tau = 1;                    // teacher-forced, same drafter, same prompts' greedy texts
  std::vector<double> tau_accuracy;  // per slot
  nlohmann::json to_json() const;
  std::string text() const;    // the printed summary
  int64_t mismatches() const;  // block and tree decodings that were not lossless (must be 0)
};

// What the served eval needs of a run.
struct ServedModels {
  const Config* c;
  const TargetWeights* target;
  const DrafterWeights* drafter;
  StepFn tau_fn;  // the step that computes tau (the run's build)
};

ServedReport served_eval(const ServedModels& m, const std::vector<std::vector<int64_t>>& prompts,
                         const ServedOptions& o);

// The context limit served decoding holds prompts to: an hf target's
// max_position_embeddings, else the run's seq_len.
int64_t context_limit(const Config& c);

// Up to `n` held-out prompts: each row's tokens before its first counted
// position (at least one token), cut to data.prompt_len when the row has
// no such boundary.
std::vector<std::vector<int64_t>> served_prompts(const Config& c, const data::Dataset& eval,
                                                 int64_t n);

}  // namespace dflash::decode
