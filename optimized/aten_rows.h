// The ATen twins of the row kernels (row_kernels.h): the same per-row math of
// the fused loss and of the online softmax, written with tensor operations
// only, so it runs on any device. Working memory: a few (rows, cols)
// temporaries in the accumulation dtype (fp32, or fp64 for float64 inputs),
// i.e. bounded by one chunk or tile like the host kernels' in-place rows.
#pragma once

#include <ATen/ATen.h>

#include "optimized/row_kernels.h"

namespace dflash::optimized {

// One chunk of the fused loss. student (n, V) logits; overwritten by dL/dlogits
// when want_grad. teacher (n, V) or undefined (no distillation term). labels
// (n) int64, weights (n) float64. ce, kl, reverse_kl, jsd, tv (n) float64 and
// argmax (n) int64 are written (a term whose weight is 0 gets zeros).
struct LossChunk {
  at::Tensor student, teacher, labels, weights;
  RowObjectives obj;
  bool want_grad;
  at::Tensor ce, kl, reverse_kl, jsd, tv, argmax;
};
void loss_rows_aten(const LossChunk& a);

// Row slices loss_rows_aten runs a chunk in: 2 for the JSD's mixture (its
// u and log(p_t / m) beside p_s, p_t and d: five (n, V) arrays, which in
// halves stay under CE + forward KL's CV(up + 3a + 1)), else 1. The
// planner's formula mirrors it (harness/memory.cpp, the mixture's / 2).
int64_t aten_row_slices(const RowObjectives& o);

// Online softmax over one key tile: scores s (n, T) in the accumulation
// dtype become p = exp(scale*s - m_new) (0 on columns j with offset + j >=
// limits[i]; limits undefined = every column visible); m, l (n) and acc
// (n, hd) are rescaled and updated in place. A row that sees nothing keeps
// its statistics.
void online_softmax_aten(at::Tensor s, const at::Tensor& limits, int64_t offset, double scale,
                         at::Tensor m, at::Tensor l, at::Tensor acc);

// Backward of one tile: s (n, T) becomes p = exp(scale*s - lse) and dp (n, T)
// becomes dS = p * (dp - D), both 0 on invisible columns.
void softmax_backward_aten(at::Tensor s, const at::Tensor& limits, int64_t offset, double scale,
                           const at::Tensor& lse, const at::Tensor& D, at::Tensor dp);

}  // namespace dflash::optimized
