// Served speculative decoding (docs/EVAL.md): what a drafter is worth when
// it is used. The target prefills the prompt with a key/value cache; each
// round the drafter proposes from the target's tapped hidden states of every
// committed position (its context, cached) and the block [bonus token, MASK x
// (bs-1)] at the next positions (SPEC.md steps 3-7 with one anchor: context
// strictly before the anchor, positions anchor + k); the target verifies the
// proposal in one cached forward and the longest agreeing prefix plus the
// target's own next token are committed.
//
// Block decoding verifies the drafter's greedy chain; tree decoding (DDTree,
// arXiv 2604.12989) verifies a draft tree built best-first from the
// drafter's per-slot distributions under a node budget, with an ancestor-only
// attention mask, and walks the target's greedy choices down it. Both are
// lossless: the committed text is the target's own greedy decoding.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/weights.h"
#include "models/generate.h"

namespace dflash::decode {

// A drafter as served: context rows arrive as the target commits them.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // The tapped target states (T, L*H) of the next T committed positions.
  virtual void extend(const at::Tensor& taps) = 0;
  // The block anchored at position context_length() holding `anchor_token`:
  // log-probabilities (slots, V) of positions anchor + 1 .. anchor + slots.
  virtual at::Tensor propose(int64_t anchor_token, int64_t slots) = 0;
  virtual int64_t context_length() const = 0;
};

// The DFlash drafter (SPEC.md steps 3-8) with its context keys and values
// cached per layer. Computes in the dtype of `frozen`.
class DFlashDrafter : public Drafter {
 public:
  DFlashDrafter(const Config& c, const DrafterWeights& w, const FrozenWeights& frozen,
                int64_t block_size);
  void extend(const at::Tensor& taps) override;
  at::Tensor propose(int64_t anchor_token, int64_t slots) override;
  int64_t context_length() const override { return length_; }

 private:
  const Config& c_;
  DrafterWeights w_;
  FrozenWeights f_;
  int64_t bs_;
  std::vector<at::Tensor> k_, v_;  // per layer (1, nkv, length, hd)
  int64_t length_ = 0;
};

// A draft tree: node i has `parent[i]` (-1: the round's anchor, the root),
// `depth[i]` >= 1 and `token[i]`; parents come before children.
struct DraftTree {
  std::vector<int64_t> parent, depth, token;
  int64_t size() const { return int64_t(token.size()); }
};

// The drafter's greedy chain (argmax of every slot) plus, best-first by the
// product of slot probabilities, the `budget` most likely prefixes (their
// nodes merged with the chain's). Budgets 0 and 1 add nothing: plain DFlash.
DraftTree build_tree(const at::Tensor& log_probs, int64_t budget);  // (slots, V)

struct DecodeOptions {
  int64_t block_size = 0;      // bs: the anchor plus bs - 1 proposed tokens
  int64_t max_new_tokens = 0;  // generated tokens (fewer at max_context or stop_token)
  int64_t max_context = 0;     // prompt + generated <= max_context
  int64_t banned_token = -1;   // never chosen by the target (the mask id)
  int64_t stop_token = -1;     // generation ends after it (-1: none)
  int64_t tree_budget = 0;     // 0: block decoding; >= 1: tree decoding (build_tree)
};

struct DecodeResult {
  std::vector<int64_t> tokens;    // generated, after the prompt
  std::vector<int64_t> accepted;  // per round: proposed tokens accepted (0 .. slots)
  std::vector<int64_t> slots;     // per round: proposal depth (bs - 1 unless near the end)
  std::vector<int64_t> nodes;     // per round: draft nodes verified
  bool stopped = false;           // the last round accepted the stop token (no bonus token)
  int64_t target_forwards = 0;    // prefill included
  double target_s = 0, drafter_s = 0, total_s = 0;
};

// The target's plain greedy decoding through models::TargetCache, one
// position per forward.
DecodeResult greedy_decode(const Config& c, const TargetWeights& target,
                           const std::vector<int64_t>& prompt, const DecodeOptions& o);

// Speculative decoding with `drafter` (fresh: no context yet).
DecodeResult speculative_decode(const Config& c, const TargetWeights& target, Drafter& drafter,
                                const std::vector<int64_t>& prompt, const DecodeOptions& o);

// Prompt and options checked against the target: ids in [0, V), not empty,
// not longer than max_context (an error, never a truncation); `what` names
// the prompt in messages.
void check_decode_inputs(const Config& c, const std::vector<int64_t>& prompt,
                         const DecodeOptions& o, const std::string& what);

}  // namespace dflash::decode
