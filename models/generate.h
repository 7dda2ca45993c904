// Greedy continuation by the target with a key/value cache, for
// self-distillation: the prompt runs once through the layers, then each new
// token costs one position per layer instead of a whole prefix forward. The
// same math as reference::target_forward (tested against it).
#pragma once

#include <ATen/ATen.h>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::models {

// ids (B, S) int64: columns [0, prompt_len) are the prompts; the rest are
// filled with the target's greedy next tokens (argmax over the vocabulary
// with `banned_token` excluded). Runs without grad.
void greedy_continue(const Config& c, const TargetWeights& target, at::Tensor& ids,
                     int64_t prompt_len, int64_t banned_token);

}  // namespace dflash::models
