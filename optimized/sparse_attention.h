// Block-sparse draft attention (SPEC.md step 7 without a mask tensor).
//
// Every query row of block n sees the same keys: context [0, anchor_n) and
// its own bs keys at S + n*bs. So each (batch row, kv head, block) is a small
// dense problem: the G = nh/nkv query heads sharing a kv head are stacked into
// G*bs rows (GQA without repeating K/V), and keys are visited in tiles of
// `tile` with an online softmax (flash-attention style). Invisible keys are
// never visited, so no (Q, S+Q) score or mask tensor exists; a keep = false
// block outputs exactly 0. Backward recomputes each tile's probabilities from
// the saved log-sum-exp. Scores and softmax statistics accumulate in fp32 (or
// fp64 for float64 inputs); GEMMs run in the input dtype. The online-softmax
// row work is the host kernel (CPU) or its ATen twin (any device), chosen by
// `kernels` ([optimized] kernels); plans are built on the host from (B, N)
// copies of anchors and keep.
#pragma once

#include <ATen/ATen.h>

#include "core/batch.h"
#include "optimized/kernels.h"

namespace dflash::optimized {

constexpr int64_t kDefaultAttentionTile = 256;

// Twin of reference::draft_attention: q (B, nh, Q, hd), k/v (B, nkv, S+Q, hd)
// -> (B, nh, Q, hd).
at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t seq_len, int64_t block_size);
at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t seq_len, int64_t block_size, int64_t tile,
                           Kernels kernels = Kernels::kHost);

// The same attention without an autograd node, for callers that register
// their own backward (ops/, the PyTorch op dflash::sparse_attention).
// anchors (B, N) int64 and keep (B, N) bool on any device. Forward returns
// out (B, nh, Q, hd) in q's dtype, lse (B, nh, Q) in the accumulation dtype
// and, for inputs below fp32 (bf16), out_acc: out in the accumulation dtype,
// which backward takes as `out` instead of out (undefined otherwise).
struct DraftAttentionForward {
  at::Tensor out, lse, out_acc;
};
struct DraftAttentionGrads {
  at::Tensor dq, dk, dv;
};
DraftAttentionForward draft_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const at::Tensor& anchors,
                                              const at::Tensor& keep, int64_t seq_len,
                                              int64_t block_size, int64_t tile, Kernels kernels);
DraftAttentionGrads draft_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& anchors, const at::Tensor& keep,
                                             int64_t seq_len, int64_t block_size, int64_t tile,
                                             Kernels kernels);

}  // namespace dflash::optimized
