// The fused chunked LM-head loss (SPEC.md steps 8-10 without (Q, V) logits).
//
// Design choice: the input gradient is computed inside forward, chunk by
// chunk (logits -> loss and dL/dlogits in place -> dL/dD = dlogits @ W),
// and backward only scales the saved (rows, H) gradient by the real upstream
// gradient. Cost: exactly three GEMMs per chunk (student logits, teacher
// logits, input gradient), the minimum; memory: the (rows, H) gradient is held
// from forward to backward, plus one chunk of student and one of teacher
// logits while forward runs. Recomputing in backward instead would save the
// (rows, H) gradient but cost two more GEMMs per chunk (~5/3 the time).
// Under no-grad (evaluation) no gradient is computed at all.
//
// Every objective of docs/LOSSES.md (CE, forward and reverse KL, JSD, TV)
// takes the same three GEMMs; reverse KL, JSD and TV add a second pass over
// the chunk's rows (their gradients need the row's sums). D-PACE's weights
// depend on the rows' CE: they are applied to the saved gradient once every
// chunk has run (a per-row factor), so no GEMM is repeated.
//
// Only counted rows are computed (keep = false blocks, slot 0 and masked
// positions never reach a GEMM); their argmax is all the metrics need. The
// row work is the host kernel (CPU) or its ATen twin (any device), chosen by
// [optimized] kernels; the GEMMs are ATen's either way.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>

#include "core/step.h"
#include "optimized/kernels.h"
#include "optimized/row_kernels.h"

namespace dflash::optimized {

// The [loss] objectives as the row implementations take them.
RowObjectives row_objectives(const LossConfig& L);

// Twin of reference::loss_and_metrics: same inputs, same outputs.
StepOutputs loss_and_metrics(const Config& c, const at::Tensor& student_hidden,
                             const at::Tensor& target_hidden, const at::Tensor& lm_head,
                             const DraftLayout& layout, const Anchors& a);

struct ChunkedLossOut {
  at::Tensor num;  // () sum_r w_r sum_o weight_o term_o(r), differentiable w.r.t. student
  at::Tensor ce, kl, reverse_kl, jsd, tv;  // (M) float64 per-row terms (0 where weight 0)
  at::Tensor weights;                      // (M) float64: the weights used (given x dynamic ones)
  at::Tensor argmax;                       // (M) int64
};

// Dynamic row weights (D-PACE): called once every chunk has run, with the
// per-row CE (M) float64; returns (M) float64 factors of the given weights.
// Detached by construction: the gradient of each row is scaled by its
// factor, never differentiated through it.
using RowWeightFn = std::function<at::Tensor(const at::Tensor& ce)>;

// The fused loss over M selected rows. student (Ns, H) [requires grad or not],
// teacher (Nt, H) (no grad; may have 0 rows when no objective needs it),
// lm_head (V, H) (frozen: never gets a gradient), rows / teacher_rows /
// labels (M) int64, weights (M) float64; chunk <= 0 means one chunk of all M
// rows. `kernels` picks the row work (optimized/kernels.h); host needs CPU
// tensors.
ChunkedLossOut chunked_lm_loss(const at::Tensor& student, const at::Tensor& teacher,
                               const at::Tensor& lm_head, const at::Tensor& rows,
                               const at::Tensor& teacher_rows, const at::Tensor& labels,
                               const at::Tensor& weights, const LossConfig& loss, int64_t chunk,
                               Kernels kernels = Kernels::kHost,
                               const RowWeightFn& dynamic_weights = {});

// The same fused loss without an autograd node, for callers that register
// their own backward (ops/, the PyTorch op dflash::fused_loss): forward over
// every chunk and, when want_grad, dL(num)/dstudent (Ns, H), unscaled (the
// gradient of `num`); no dynamic weights. chunked_lm_loss_backward is the
// backward of both: the saved gradient times the upstream gradient g (a
// scalar) and, where defined, the (Ns, 1) per-row scale.
struct FusedLossForward {
  ChunkedLossOut out;
  at::Tensor grad;  // (Ns, H) or undefined
};
FusedLossForward chunked_lm_loss_forward(const at::Tensor& student, const at::Tensor& teacher,
                                         const at::Tensor& lm_head, const at::Tensor& rows,
                                         const at::Tensor& teacher_rows, const at::Tensor& labels,
                                         const at::Tensor& weights, const LossConfig& loss,
                                         int64_t chunk, Kernels kernels, bool want_grad);
at::Tensor chunked_lm_loss_backward(const at::Tensor& grad, const at::Tensor& scale,
                                    const at::Tensor& g);

// D-PACE's factors (docs/LOSSES.md) for the M computed rows: `rows` are the
// counted slots' flat indices (ascending) among `slots` = B*Q slots in blocks
// of `block_size`; ce (M) float64. By scans over the (B*N, bs) slot table.
at::Tensor dpace_row_weights(const at::Tensor& ce, const at::Tensor& rows, int64_t slots,
                             int64_t block_size, double alpha);

// Counters for tests (process-wide): chunks run, and chunks that computed a gradient.
struct ChunkedLossStats {
  std::atomic<int64_t> chunks{0};
  std::atomic<int64_t> gradient_chunks{0};
};
ChunkedLossStats& chunked_loss_stats();

}  // namespace dflash::optimized
