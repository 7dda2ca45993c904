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

// sum over columns of a * b per row, without an (n, V) temporary: (n).
at::Tensor row_dot(const at::Tensor& a, const at::Tensor& b) {
  return at::bmm(a.unsqueeze(1), b.unsqueeze(2)).view({a.size(0)});
}

// CE + forward KL only (the row kernels' fused pass): KL(p_t || p_s) at
// temperature T on both sides; dL/dz = w (ce_w (softmax(z) - onehot) +
// kl_w / T (p_s - p_t)), the one-hot subtracted in the accumulation dtype
// before the store. Returns the gradient (n, V), or undefined.
at::Tensor ce_and_kl(const LossChunk& a, const at::Tensor& z, const at::Tensor& lse,
                     const at::Tensor& w, double kl_w) {
  const at::Tensor lab = a.labels.unsqueeze(1);  // (n, 1)
  at::Tensor g_kl;                               // (n, V) kl_w w / T (p_s - p_t)
  if (a.teacher.defined()) {
    // At most four (n, V) arrays in the accumulation dtype live at once: z,
    // log p_t (then the KL terms, in place), log p_s (then the gradient) and p_t.
    const double it = a.obj.inv_temperature;
    const at::ScalarType acc = z.scalar_type();
    at::Tensor log_pt = (a.teacher.to(acc) * it).log_softmax(1);        // (n, V)
    // log_softmax, not z - lse: that rounds z and lse, each as large as
    // the logits, and p_s - p_t loses its digits where the two agree.
    at::Tensor log_ps = (it == 1.0 ? z : z * it).log_softmax(1);  // (n, V)
    const at::Tensor pt = log_pt.exp();                                 // (n, V)
    // p_t (log p_t - log p_s), the difference first (it cancels where the
    // two agree), and 0 where p_t underflows to 0 (log p_t may be -inf
    // there; a NaN still propagates).
    at::Tensor term = log_pt.sub_(log_ps).mul_(pt);
    const at::Tensor kl = term.masked_fill_(pt == 0, 0).sum(1);
    (a.obj.kl != 0 ? a.kl : a.jsd).copy_(kl);  // jsd at beta = 0 is the forward KL
    if (a.obj.kl != 0 && a.obj.jsd != 0) a.jsd.copy_(kl);
    log_pt = term = at::Tensor();
    if (a.want_grad) g_kl = log_ps.exp_().sub_(pt).mul_(w * (kl_w * it));
  }
  if (!a.want_grad) return at::Tensor();
  const at::Tensor gce = w * a.obj.ce;        // (n, 1)
  at::Tensor g = (z - lse).exp_().mul_(gce);  // (n, V) w ce_w softmax(z)
  g.scatter_add_(1, lab, -gce);               // - w ce_w onehot
  if (g_kl.defined()) g.add_(g_kl);
  return g;
}

// The general path (reverse KL, JSD or TV on), the same formulas as the
// row kernels' (docs/LOSSES.md, row_kernels.cpp): per-row sums first
// (row_dot), the reverse KL centred on d* (d at the student's argmax) and
// the TV gradient from the student's mass on each side, then the gradient
// in place. (n, V) arrays in the accumulation dtype alive at the peak: z,
// log p_t (then d - d*, then the gradient), log p_s (then sign(p_s - p_t),
// then softmax(z)), p_t, p_s, p_s - p_t, one transient, and with the JSD
// log m (then log p_s - log m) and the transients of logaddexp.
at::Tensor general_terms(const LossChunk& a, const at::Tensor& z, const at::Tensor& lse,
                         const at::Tensor& w, double kl_w, double rkl_w) {
  const RowObjectives& o = a.obj;
  const double it = o.inv_temperature, b = o.jsd_beta;
  const bool jsd_mid = o.jsd != 0 && b != 0 && b != 1;
  const at::ScalarType acc = z.scalar_type();
  at::Tensor lt = (a.teacher.to(acc) * it).log_softmax(1);        // (n, V) log p_t
  at::Tensor ls = (it == 1.0 ? z : z * it).log_softmax(1);         // (n, V) log p_s
  const at::Tensor pt = lt.exp(), ps = ls.exp();                  // (n, V)
  at::Tensor kl_sm, lm;                                           // (n), (n, V)
  if (jsd_mid) {
    lm = at::logaddexp(lt + std::log(b), ls + std::log1p(-b));  // log m
    const at::Tensor kl_tm = row_dot(pt, lt - lm);               // KL(p_t || m)
    lm.neg_().add_(ls);                                          // log p_s - log m
    // Near agreement log(p_s / m) is 2 atanh(s), s = beta (p_s - p_t) / (p_s
    // + m), not the difference of two logs that rounds its digits away
    // (row_kernels.cpp, log_ps_over_m); where |s| > 1/3 the difference stays.
    at::Tensor s = (ps - pt).mul_(b);                             // (n, V)
    at::Tensor t = at::add(ps, pt, b / (2 - b)).mul_(2 - b);      // (n, V) p_s + m
    s.div_(t.clamp_min_(std::numeric_limits<float>::min()));      // 0 where both are 0
    at::atanh_out(t, s.clamp_(-0.5, 0.5)).mul_(2).sub_(lm);       // 2 atanh(s) - lm, finite
    lm.add_(t.mul_(s.abs_().le_(1.0 / 3)));                       // the atanh where |s| <= 1/3
    kl_sm = row_dot(ps, lm);                                     // KL(p_s || m)
    a.jsd.copy_(b * kl_tm + (1 - b) * kl_sm);
  }
  at::Tensor& d = lt.neg_().add_(ls);  // (n, V) d = log p_s - log p_t
  const at::Tensor d_star = d.gather(1, a.argmax.unsqueeze(1));  // (n, 1)
  d.sub_(d_star);                                                 // d - d*
  const at::Tensor kl = -(row_dot(pt, d) + d_star.squeeze(1));    // KL(p_t || p_s)
  const at::Tensor rkl_c = row_dot(ps, d);                        // RKL - d*
  const at::Tensor rkl = rkl_c + d_star.squeeze(1);
  at::Tensor diff = ps - pt;                       // (n, V)
  at::Tensor& sg = at::sign_out(ls, diff);         // (n, V) sign(p_s - p_t)
  const at::Tensor tv = 0.5 * row_dot(diff, sg);   // 1/2 sum |p_s - p_t|
  auto mass = [&](const at::Tensor& side) { return (ps * side).sum(1, true); };  // (n, 1)
  const at::Tensor p_pos = mass(sg > 0), p_neg = mass(sg < 0), p_zero = mass(sg == 0);
  if (o.kl != 0) a.kl.copy_(kl);
  if (o.reverse_kl != 0) a.reverse_kl.copy_(rkl);
  if (o.jsd != 0 && !jsd_mid) a.jsd.copy_(b == 0 ? kl : rkl);
  if (o.tv != 0) a.tv.copy_(tv);
  if (!a.want_grad) return at::Tensor();
  // inner = rkl_w ((d - d*) - (RKL - d*)) + tv_w (sign - E)/2 + jsd_w (1-beta)
  //         (log p_s - log m - KL(p_s || m)), E/2 from the masses (row_kernels.cpp)
  at::Tensor& g = d.sub_(rkl_c.unsqueeze(1)).mul_(rkl_w);
  if (o.tv != 0)
    g.add_(at::where(sg > 0, p_neg + 0.5 * p_zero,
                     at::where(sg < 0, -(p_pos + 0.5 * p_zero), 0.5 * (p_neg - p_pos)))
               .mul_(o.tv));
  if (jsd_mid) g.add_(lm.sub_(kl_sm.unsqueeze(1)).mul_(o.jsd * (1 - b)));
  g.mul_(ps).add_(diff.mul_(kl_w)).mul_(w * it);
  const at::Tensor gce = w * o.ce;  // (n, 1)
  at::Tensor& p = it == 1.0 ? sg.copy_(ps) : at::sub_out(sg, z, lse).exp_();  // softmax(z)
  g.addcmul_(p, gce);
  g.scatter_add_(1, a.labels.unsqueeze(1), -gce);  // - w ce_w onehot
  return g;
}

}  // namespace

// CE = logsumexp(z) - z[label]; the distillation terms of docs/LOSSES.md.
void loss_rows_aten(const LossChunk& a) {
  const at::ScalarType acc = a.student.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor z = a.student.to(acc);  // (n, V): aliases student for fp32/fp64
  a.argmax.copy_(z.argmax(1));             // first maximum
  const at::Tensor lse = z.logsumexp(1, true);  // (n, 1)
  a.ce.copy_((lse - z.gather(1, a.labels.unsqueeze(1))).squeeze(1));
  for (const at::Tensor& t : {a.kl, a.reverse_kl, a.jsd, a.tv}) t.zero_();
  const at::Tensor w = a.weights.to(acc).unsqueeze(1);  // (n, 1)
  const RowObjectives& o = a.obj;
  const bool j0 = o.jsd != 0 && o.jsd_beta == 0, j1 = o.jsd != 0 && o.jsd_beta == 1;
  const double kl_w = o.kl + (j0 ? o.jsd : 0.0), rkl_w = o.reverse_kl + (j1 ? o.jsd : 0.0);
  const bool general = o.reverse_kl != 0 || o.tv != 0 || (o.jsd != 0 && !j0);
  const at::Tensor g = a.teacher.defined() && general ? general_terms(a, z, lse, w, kl_w, rkl_w)
                                                      : ce_and_kl(a, z, lse, w, kl_w);
  if (a.want_grad) a.student.copy_(g);
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
