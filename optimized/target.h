// The frozen target's forward with a memory-bounded causal attention: the
// queries go in chunks of optimized.target_query_chunk rows, each against
// the keys up to its last row, so the scores held at once are
// (B, nh, chunk, <= S) instead of (B, nh, S, S). Exact: every query row's
// softmax still sees all of its keys (no online rescaling needed). The rest
// of the layer is reference::target_forward_with's.
#pragma once

#include <ATen/ATen.h>

#include "core/config.h"
#include "core/weights.h"
#include "reference/target.h"

namespace dflash::optimized {

// q (B, nh, S, hd), k/v (B, nkv, S, hd) -> (B, nh, S, hd); chunk >= 1.
at::Tensor chunked_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    int64_t query_chunk);

// Query-chunked when optimized.target_query_chunk > 0, else the dense
// reference forward.
reference::TargetOutputs target_forward(const Config& c, const TargetWeights& w,
                                        const at::Tensor& input_ids);  // (B, S) int64

}  // namespace dflash::optimized
