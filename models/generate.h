// The target's key/value-cached forward, one implementation for
// self-distillation (batched greedy continuation) and served decoding
// (decode/speculative.h: block and tree verification). The same math as
// reference::target_forward over the committed positions (tested against it:
// models.Generate.*, decode.Speculative.GreedyDecodeEqualsUncachedForward).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::models {

// The target with a key/value cache over committed positions [0, length()),
// for B sequences side by side (every row commits the same positions).
// Runs without grad, on the target's device.
class TargetCache {
 public:
  // `banned` (-1: none) is never a greedy choice (the mask id).
  TargetCache(const Config& c, const TargetWeights& w, int64_t banned);
  struct Out {
    at::Tensor choice;  // (B, T - choices_from) int64: greedy next token after new positions
    at::Tensor taps;    // (B, T, L*H): the tapped layers' outputs at the new positions
  };
  // Runs `tokens` (B, T) at `positions` (T, or (B, T) per row) after the
  // committed ones. A new position sees every committed one plus the new
  // ones `visible` (T, T) bool marks (undefined: causal). Their keys stay
  // pending until commit. Only rows [choices_from, T) go through the LM
  // head (a prefill needs the last one: no (T, V) logits for a long
  // prompt). `real` (B, T) bool (undefined: all) marks padding as not real:
  // a padded position is never a key, now or after commit (rows of
  // different lengths side by side).
  Out forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& visible,
              int64_t choices_from = 0, const at::Tensor& real = {});
  // Keeps the pending positions `rows` (indices into the last forward's T,
  // in order) after the committed ones and drops the rest.
  void commit(const std::vector<int64_t>& rows);
  int64_t length() const { return length_; }

 private:
  const Config& c_;
  const TargetWeights& w_;
  int64_t banned_;
  std::vector<at::Tensor> k_, v_;   // per layer (B, nkv, length + pending, hd)
  at::Tensor real_, pending_real_;  // (B, length), (B, pending) bool; undefined: all real
  int64_t length_ = 0;
};

// 0, 1, ..., n - 1: every row of a forward of n positions.
std::vector<int64_t> iota_rows(int64_t n);

// Pieces of a cached forward, shared with the served drafter
// (decode/speculative.cpp): RoPE at explicit positions (T), as (1, 1, T, hd)
// factors; a key/value cache grown along positions (dim 2).
struct Rope {
  at::Tensor cos, sin;  // (1, 1, T, hd)
};
Rope rope_at(const at::Tensor& positions, const LayerShape& s, at::ScalarType dtype);
at::Tensor cat_keys(const at::Tensor& cache, const at::Tensor& fresh);

// ids (B, S) int64: columns [0, prompt_len) are the prompts; the rest are
// filled with the target's greedy next tokens (argmax over the vocabulary
// with `banned_token` excluded), through TargetCache: the prompts in one
// forward, then one position per forward.
void greedy_continue(const Config& c, const TargetWeights& target, at::Tensor& ids,
                     int64_t prompt_len, int64_t banned_token);

// Conversations answered by the target: in each row, each run of `mask`
// (an assistant turn of a prepared conversation, ending with its
// end-of-turn token) is replaced by the target's greedy answer to
// everything before it (earlier answers already its own), up to and
// including that end-of-turn token or the row's end; every other token is
// kept, in order. ids (N, S) int64 and mask (N, S) bool on the host,
// rewritten in place (answers marked in mask, the rest 0, padded with
// token 0). The N rows are decoded side by side in one KV cache: per
// forward each row feeds its next prompt part (prefilled whole) or its
// last answer token, right-aligned, the shorter rows padded with
// positions that are never keys.
void greedy_answers(const Config& c, const TargetWeights& target, at::Tensor& ids, at::Tensor& mask,
                    int64_t banned_token);

}  // namespace dflash::models
