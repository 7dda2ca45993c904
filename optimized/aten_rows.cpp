#include "optimized/aten_rows.h"

#include <limits>

namespace dflash::optimized {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// (n, T) visibility of key offset + j for row i: offset + j < limits[i].
at::Tensor visible(const at::Tensor& s, const at::Tensor& limits, int64_t offset) {
  const at::Tensor cols = at::arange(offset, offset + s.size(1), limits.options());  // (T)
  return cols.unsqueeze(0) < limits.unsqueeze(1);                                    // (n, T)
}

}  // namespace

// CE = logsumexp(z) - z[label]; KL(p_t || p_s) at temperature T on both
// sides; dL/dz = w * (ce_w * (softmax(z) - onehot) + kl_w / T * (p_s - p_t)),
// the one-hot subtracted in the accumulation dtype before the store.
void loss_rows_aten(const LossChunk& a) {
  const at::ScalarType acc = a.student.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor z = a.student.to(acc);        // (n, V): aliases student for fp32/fp64
  const at::Tensor lab = a.labels.unsqueeze(1);  // (n, 1)
  a.argmax.copy_(z.argmax(1));                   // first maximum
  const at::Tensor lse = z.logsumexp(1, true);   // (n, 1)
  a.ce.copy_((lse - z.gather(1, lab)).squeeze(1));
  const at::Tensor w = a.weights.to(acc).unsqueeze(1);  // (n, 1)
  at::Tensor g_kl;                                      // (n, V) kl_w w / T (p_s - p_t)
  if (a.teacher.defined()) {
    // At most four (n, V) arrays in the accumulation dtype live at once: z,
    // log p_t (then the KL terms, in place), log p_s (then the gradient) and p_t.
    const double it = a.inv_temperature;
    at::Tensor log_pt = (a.teacher.to(acc) * it).log_softmax(1);        // (n, V)
    at::Tensor log_ps = it == 1.0 ? z - lse : (z * it).log_softmax(1);  // (n, V)
    const at::Tensor pt = log_pt.exp();                                 // (n, V)
    // p_t (log p_t - log p_s), the difference first (it cancels where the
    // two agree), and 0 where p_t underflows to 0 (log p_t may be -inf
    // there; a NaN still propagates).
    at::Tensor term = log_pt.sub_(log_ps).mul_(pt);
    a.kl.copy_(term.masked_fill_(pt == 0, 0).sum(1));
    log_pt = term = at::Tensor();
    if (a.want_grad) g_kl = log_ps.exp_().sub_(pt).mul_(w * (a.kl_weight * it));
  } else {
    a.kl.zero_();
  }
  if (!a.want_grad) return;
  const at::Tensor gce = w * a.ce_weight;     // (n, 1)
  at::Tensor g = (z - lse).exp_().mul_(gce);  // (n, V) w ce_w softmax(z)
  g.scatter_add_(1, lab, -gce);               // - w ce_w onehot
  if (g_kl.defined()) g.add_(g_kl);
  a.student.copy_(g);
}

void online_softmax_aten(at::Tensor s, const at::Tensor& limits, int64_t offset, double scale,
                         at::Tensor m, at::Tensor l, at::Tensor acc) {
  s.mul_(scale);
  if (limits.defined()) s.masked_fill_(visible(s, limits, offset).logical_not_(), -kInf);
  const at::Tensor m_new = at::maximum(m, s.amax(1));  // (n); -inf where nothing seen yet
  // Rows that have seen nothing (m_new = -inf) shift by 0: their p is exp(-inf) = 0.
  const at::Tensor shift = at::where(m_new == -kInf, at::zeros_like(m_new), m_new);
  const at::Tensor alpha = at::where(m == -kInf, at::zeros_like(m), (m - shift).exp());  // (n)
  s.sub_(shift.unsqueeze(1)).exp_();
  l.mul_(alpha).add_(s.sum(1));
  acc.mul_(alpha.unsqueeze(1));
  m.copy_(m_new);
}

void softmax_backward_aten(at::Tensor s, const at::Tensor& limits, int64_t offset, double scale,
                           const at::Tensor& lse, const at::Tensor& D, at::Tensor dp) {
  s.mul_(scale).sub_(lse.unsqueeze(1));
  if (limits.defined()) s.masked_fill_(visible(s, limits, offset).logical_not_(), -kInf);
  s.exp_();
  dp.sub_(D.unsqueeze(1)).mul_(s);
}

}  // namespace dflash::optimized
