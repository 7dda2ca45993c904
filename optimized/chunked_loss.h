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
// Only counted rows are computed (keep = false blocks, slot 0 and masked
// positions never reach a GEMM); their argmax is all the metrics need. The
// row work is the host kernel (CPU) or its ATen twin (any device), chosen by
// [optimized] kernels; the GEMMs are ATen's either way.
#pragma once

#include <ATen/ATen.h>

#include <atomic>

#include "core/step.h"
#include "optimized/kernels.h"

namespace dflash::optimized {

// Twin of reference::loss_and_metrics: same inputs, same outputs.
StepOutputs loss_and_metrics(const Config& c, const at::Tensor& student_hidden,
                             const at::Tensor& target_hidden, const at::Tensor& lm_head,
                             const DraftLayout& layout, const Anchors& a);

struct ChunkedLossOut {
  at::Tensor num;     // () sum_r w_r (ce_w CE_r + kl_w KL_r), differentiable w.r.t. student
  at::Tensor ce;      // (M) float64 per-row CE
  at::Tensor kl;      // (M) float64 per-row KL (0 without teacher)
  at::Tensor argmax;  // (M) int64
};

// The fused loss over M selected rows. student (Ns, H) [requires grad or not],
// teacher (Nt, H) (no grad; may have 0 rows when kl_weight == 0), lm_head
// (V, H) (frozen: never gets a gradient), rows / teacher_rows / labels (M)
// int64, weights (M) float64; chunk <= 0 means one chunk of all M rows.
// `kernels` picks the row work (optimized/kernels.h); host needs CPU tensors.
ChunkedLossOut chunked_lm_loss(const at::Tensor& student, const at::Tensor& teacher,
                               const at::Tensor& lm_head, const at::Tensor& rows,
                               const at::Tensor& teacher_rows, const at::Tensor& labels,
                               const at::Tensor& weights, const LossConfig& loss, int64_t chunk,
                               Kernels kernels = Kernels::kHost);

// Counters for tests (process-wide): chunks run, and chunks that computed a gradient.
struct ChunkedLossStats {
  std::atomic<int64_t> chunks{0};
  std::atomic<int64_t> gradient_chunks{0};
};
ChunkedLossStats& chunked_loss_stats();

}  // namespace dflash::optimized
