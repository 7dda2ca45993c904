#include "optimized/chunked_loss.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "optimized/aten_rows.h"
#include "optimized/row_kernels.h"

namespace dflash::optimized {

ChunkedLossStats& chunked_loss_stats() {
  static ChunkedLossStats s;
  return s;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

RowDtype row_dtype(at::ScalarType t) {
  if (t == at::kDouble) return RowDtype::kFloat64;
  if (t == at::kBFloat16) return RowDtype::kBFloat16;
  TORCH_CHECK(t == at::kFloat, "chunked loss: unsupported dtype ", t);
  return RowDtype::kFloat32;
}

struct ChunkResult {
  at::Tensor num, ce, kl, reverse_kl, jsd, tv, weights, argmax;
  at::Tensor grad;   // (Ns, H) when wanted
  at::Tensor scale;  // (Ns, 1) dynamic weight of each student row, or undefined
};

// The row work of one chunk, by the chosen implementation.
void chunk_rows(const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& lab,
                const at::Tensor& w64, const RowObjectives& obj, Kernels kernels, bool want_grad,
                ChunkResult& r, int64_t c0, int64_t n) {
  auto at_rows = [&](const at::Tensor& t) { return t.narrow(0, c0, n); };
  if (kernels == Kernels::kAten) {
    loss_rows_aten({zs, zt, at_rows(lab), at_rows(w64), obj, want_grad, at_rows(r.ce),
                    at_rows(r.kl), at_rows(r.reverse_kl), at_rows(r.jsd), at_rows(r.tv),
                    at_rows(r.argmax)});
    return;
  }
  auto out = [&](const at::Tensor& t) { return t.data_ptr<double>() + c0; };
  const LossRows a{row_dtype(zs.scalar_type()),
                   zs.size(1),
                   zs.data_ptr(),
                   zt.defined() ? zt.data_ptr() : nullptr,
                   lab.data_ptr<int64_t>() + c0,
                   w64.data_ptr<double>() + c0,
                   obj,
                   want_grad,
                   out(r.ce),
                   out(r.kl),
                   out(r.reverse_kl),
                   out(r.jsd),
                   out(r.tv),
                   r.argmax.data_ptr<int64_t>() + c0,
                   nullptr,
                   /*teacher_scratch=*/true};  // zt is this chunk's buffer
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { loss_rows(a, b, e); });
}

// Forward over all chunks; with want_grad, also dL/dstudent (unscaled).
ChunkResult run_chunks(const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& W,
                       const at::Tensor& rows, const at::Tensor& trows, const at::Tensor& labels,
                       const at::Tensor& weights, const LossConfig& L, int64_t chunk,
                       Kernels kernels, bool want_grad, const RowWeightFn& dynamic) {
  const int64_t M = rows.numel(), H = student.size(1), V = W.size(0);
  const bool with_teacher = L.uses_teacher();
  const int64_t C = std::max<int64_t>(1, chunk > 0 ? std::min(chunk, M) : M);
  const auto opt = student.options();
  ChunkResult r;
  for (at::Tensor* t : {&r.ce, &r.kl, &r.reverse_kl, &r.jsd, &r.tv})
    *t = at::zeros({M}, opt.dtype(at::kDouble));
  r.argmax = at::zeros({M}, opt.dtype(at::kLong));
  if (want_grad) r.grad = at::zeros_like(student, at::MemoryFormat::Contiguous);
  at::Tensor xs = at::empty({C, H}, opt), zs = at::empty({C, V}, opt);  // one chunk
  at::Tensor xt, zt;
  if (with_teacher) xt = at::empty({C, H}, opt), zt = at::empty({C, V}, opt);
  at::Tensor gbuf = want_grad ? at::empty({C, H}, opt) : at::Tensor();
  const at::Tensor w64 = weights.to(at::kDouble).contiguous(), lab = labels.contiguous();
  const RowObjectives obj = row_objectives(L);
  for (int64_t c0 = 0; c0 < M; c0 += C) {
    const int64_t n = std::min(C, M - c0);
    const at::Tensor rows_c = rows.narrow(0, c0, n);
    at::Tensor xs_c = xs.narrow(0, 0, n), zs_c = zs.narrow(0, 0, n);  // (n, H), (n, V)
    at::index_select_out(xs_c, student, 0, rows_c);
    at::mm_out(zs_c, xs_c, W.t());
    at::Tensor zt_c;
    if (with_teacher) {
      at::Tensor xt_c = xt.narrow(0, 0, n);
      zt_c = zt.narrow(0, 0, n);  // (n, V)
      at::index_select_out(xt_c, teacher, 0, trows.narrow(0, c0, n));
      at::mm_out(zt_c, xt_c, W.t());
    }
    chunk_rows(zs_c, zt_c, lab, w64, obj, kernels, want_grad, r, c0, n);
    ++chunked_loss_stats().chunks;
    if (want_grad) {
      at::Tensor g = gbuf.narrow(0, 0, n);
      r.grad.index_copy_(0, rows_c, at::mm_out(g, zs_c, W));  // (n, H)
      ++chunked_loss_stats().gradient_chunks;
    }
  }
  r.weights = w64;
  if (dynamic) {
    const at::Tensor f = dynamic(r.ce).to(at::kDouble).detach();  // (M)
    r.weights = w64 * f;
    if (want_grad) {
      const at::ScalarType acc = student.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      r.scale = at::zeros({student.size(0), 1}, opt.dtype(acc));
      r.scale.index_copy_(0, rows, f.to(acc).unsqueeze(1));
    }
  }
  const at::ScalarType acc = student.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  r.num = ((L.ce_weight * r.ce + L.kl_weight * r.kl + L.reverse_kl_weight * r.reverse_kl +
            L.jsd_weight * r.jsd + L.tv_weight * r.tv) *
           r.weights)
              .sum()
              .to(acc);
  return r;
}

ChunkedLossOut as_out(const ChunkResult& r) {
  return {r.num, r.ce, r.kl, r.reverse_kl, r.jsd, r.tv, r.weights, r.argmax};
}

struct FusedLoss : public torch::autograd::Function<FusedLoss> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& student,
                               const at::Tensor& teacher, const at::Tensor& W,
                               const at::Tensor& rows, const at::Tensor& trows,
                               const at::Tensor& labels, const at::Tensor& weights,
                               const LossConfig& L, int64_t chunk, Kernels kernels,
                               const RowWeightFn& dynamic) {
    ChunkResult r = run_chunks(student, teacher, W, rows, trows, labels, weights, L, chunk, kernels,
                               true, dynamic);
    ctx->save_for_backward({r.grad, r.scale});
    ctx->mark_non_differentiable({r.ce, r.kl, r.reverse_kl, r.jsd, r.tv, r.weights, r.argmax});
    return {r.num, r.ce, r.kl, r.reverse_kl, r.jsd, r.tv, r.weights, r.argmax};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The per-row outputs are non-differentiable: only the upstream gradient
    // of num (a scalar, whatever its value) and, with dynamic weights, each
    // row's factor scale the saved input gradient.
    const auto saved = ctx->get_saved_variables();
    const at::Tensor gs = chunked_lm_loss_backward(saved[0], saved[1], grad_outputs[0]);
    // One entry per forward argument; W (the frozen LM head) never gets one.
    return {gs, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

}  // namespace

at::Tensor chunked_lm_loss_backward(const at::Tensor& grad, const at::Tensor& scale,
                                    const at::Tensor& g) {
  if (!g.defined()) return {};
  // Scaled in fp32 (fp64 for float64): 1 / sum(w) rounded to bf16 would
  // shift the whole gradient by up to 0.4%.
  const at::ScalarType acc = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor up = scale.defined() ? scale * g.to(acc) : g.to(acc);
  return (grad.to(acc) * up).to(grad.scalar_type());
}

RowObjectives row_objectives(const LossConfig& L) {
  return {L.ce_weight, L.kl_weight, L.reverse_kl_weight, L.jsd_weight,
          L.jsd_beta,  L.tv_weight, 1.0 / L.temperature};
}

at::Tensor dpace_row_weights(const at::Tensor& ce, const at::Tensor& rows, int64_t slots,
                             int64_t bs, double alpha) {
  const auto f64 = ce.options().dtype(at::kDouble);
  at::Tensor smooth = at::ones({slots}, f64), on = at::zeros({slots}, f64);  // (B*Q)
  smooth.index_copy_(0, rows, (1 - alpha) * (-ce).exp() + alpha);
  on.index_fill_(0, rows, 1.0);
  const at::Tensor prefix = smooth.view({-1, bs}).cumprod(1) * on.view({-1, bs});  // (B*N, bs)
  const at::Tensor suffix = prefix.flip(1).cumsum(1).flip(1);                      // (B*N, bs)
  return suffix.reshape(-1).index_select(0, rows);                                 // (M)
}

void check_chunked_loss_inputs(const at::Tensor& student, const at::Tensor& W,
                               const at::Tensor& rows, const at::Tensor& trows,
                               const at::Tensor& labels, const at::Tensor& weights,
                               Kernels kernels) {
  TORCH_CHECK(student.dim() == 2 && W.dim() == 2 && student.size(1) == W.size(1),
              "chunked_lm_loss: student (Ns, H) and lm_head (V, H) expected");
  TORCH_CHECK(student.device() == W.device(), "chunked_lm_loss: student on ", student.device(),
              " but lm_head on ", W.device());
  TORCH_CHECK(kernels == Kernels::kAten || student.is_cpu(),
              "chunked_lm_loss: the host row kernels run on CPU tensors (found ", student.device(),
              "); use optimized.kernels = \"aten\" or \"auto\"");
  const int64_t M = rows.numel();
  TORCH_CHECK(
      trows.numel() == M && labels.numel() == M && weights.numel() == M,
      "chunked_lm_loss: rows, teacher_rows, labels and weights must have one entry per row");
  if (M > 0) {
    TORCH_CHECK(labels.min().item<int64_t>() >= 0 && labels.max().item<int64_t>() < W.size(0),
                "chunked_lm_loss: labels must lie in [0, V = ", W.size(0), ")");
    TORCH_CHECK(rows.min().item<int64_t>() >= 0 && rows.max().item<int64_t>() < student.size(0),
                "chunked_lm_loss: row index out of range");
  }
}

FusedLossForward chunked_lm_loss_forward(const at::Tensor& student, const at::Tensor& teacher,
                                         const at::Tensor& W, const at::Tensor& rows,
                                         const at::Tensor& trows, const at::Tensor& labels,
                                         const at::Tensor& weights, const LossConfig& L,
                                         int64_t chunk, Kernels kernels, bool want_grad) {
  check_chunked_loss_inputs(student, W, rows, trows, labels, weights, kernels);
  at::NoGradGuard no_grad;
  ChunkResult r = run_chunks(student, teacher, W, rows, trows, labels, weights, L, chunk, kernels,
                             want_grad, {});
  return {as_out(r), r.grad};
}

ChunkedLossOut chunked_lm_loss(const at::Tensor& student, const at::Tensor& teacher,
                               const at::Tensor& W, const at::Tensor& rows, const at::Tensor& trows,
                               const at::Tensor& labels, const at::Tensor& weights,
                               const LossConfig& L, int64_t chunk, Kernels kernels,
                               const RowWeightFn& dynamic) {
  check_chunked_loss_inputs(student, W, rows, trows, labels, weights, kernels);
  const bool want_grad = at::GradMode::is_enabled() && student.requires_grad();
  if (!want_grad) {
    at::NoGradGuard no_grad;
    return as_out(run_chunks(student, teacher, W, rows, trows, labels, weights, L, chunk, kernels,
                             false, dynamic));
  }
  variable_list o = FusedLoss::apply(student, teacher, W.detach(), rows, trows, labels, weights, L,
                                     chunk, kernels, dynamic);
  return {o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]};
}

StepOutputs loss_and_metrics(const Config& c, const at::Tensor& D, const at::Tensor& Ht,
                             const at::Tensor& lm_head, const DraftLayout& layout,
                             const Anchors& a) {
  const LossConfig& L = c.loss;
  const int64_t B = D.size(0), Q = D.size(1), S = Ht.size(1), H = D.size(2);
  // Only counted rows are computed (w > 0 before decay: a decayed weight may
  // underflow to 0, but the slot still counts for the metrics); teacher rows
  // index the flattened (B*S, H) hidden.
  const at::Tensor w_all = layout.weights.reshape(-1);                       // (B*Q)
  const at::Tensor rows = layout.counted.reshape(-1).nonzero().reshape(-1);  // (M)
  const auto idx = D.options().dtype(at::kLong);
  const at::Tensor batch_of = at::arange(B, idx).repeat_interleave(Q);  // (B*Q)
  const at::Tensor trows =
      (batch_of * S + layout.teacher_index.reshape(-1)).index_select(0, rows);  // (M)
  const at::Tensor labels = layout.labels.reshape(-1).index_select(0, rows);    // (M)
  const at::Tensor weights = w_all.index_select(0, rows);                       // (M)
  const at::Tensor teacher = L.uses_teacher() ? Ht.reshape({B * S, H}) : Ht.new_empty({0, H});
  RowWeightFn dynamic;
  if (L.weighting == Weighting::kDpace)
    dynamic = [&rows, slots = B * Q, bs = layout.block_size, alpha = L.dpace_alpha](
                  const at::Tensor& ce) { return dpace_row_weights(ce, rows, slots, bs, alpha); };
  const ChunkedLossOut r =
      chunked_lm_loss(D.reshape({B * Q, H}), teacher, lm_head, rows, trows, labels, weights, L,
                      L.chunk_size, resolve_kernels(c.optimized.kernels, D.device()), dynamic);

  const at::ScalarType acc = r.num.scalar_type();
  const at::Tensor wsum = r.weights.sum().to(acc);
  const at::Tensor den = at::where(wsum > 0, wsum, at::ones_like(wsum));  // 0/0 := 0
  StepOutputs out;
  out.loss = r.num / den;
  auto term = [&](const at::Tensor& per_row, at::Tensor& ratio, at::Tensor& sum) {
    sum = (r.weights * per_row).sum().to(acc);
    ratio = sum / den;
  };
  term(r.ce, out.ce, out.ce_sum);
  term(r.kl, out.kl, out.kl_sum);
  term(r.reverse_kl, out.reverse_kl, out.reverse_kl_sum);
  term(r.jsd, out.jsd, out.jsd_sum);
  term(r.tv, out.tv, out.tv_sum);
  out.weight_sum = wsum;
  at::Tensor hit = at::zeros({B * Q}, idx.dtype(at::kBool));
  hit.index_put_({rows}, r.argmax == labels);
  out.set_metrics(slot_metrics(hit.view({B, Q}), layout, a));
  out.student_hidden = D.detach();
  return out;
}

}  // namespace dflash::optimized
