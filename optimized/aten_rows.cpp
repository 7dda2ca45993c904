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
    at::Tensor log_pt = (a.teacher.to(acc) * it).log_softmax(1);  // (n, V)
    // log_softmax, not z - lse: that rounds z and lse, each as large as
    // the logits, and p_s - p_t loses its digits where the two agree.
    at::Tensor log_ps = (it == 1.0 ? z : z * it).log_softmax(1);  // (n, V)
    const at::Tensor pt = log_pt.exp();                           // (n, V)
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

// The general path (reverse KL, JSD or TV on), the formulas of
// docs/LOSSES.md in the fewest (n, V) passes: every term but the forward KL
// is a function of log p_s whose gradient has the softmax-Jacobian form p_s
// (G - sum p_s G), so one fused softmax backward takes the sum of their
// upstreams G (row_kernels.cpp computes the same sums by hand). The values:
// with nd = log p_t - log p_s centred on its value at the student's argmax
// (-d*), KL = sum p_t nd + nd*, RKL = -sum p_s nd - nd*; the JSD from u =
// p_t / p_s - 1 = expm1(nd) (exact near agreement, where log p_s - log m
// would cancel): log(p_s / m) = -log1p(beta u), log(p_t / m) = -log1p(-(1 -
// beta) u / e^nd), nd clamped to +-80 so that e^nd stays a normal float (it
// moves only terms where one side is below e^-80 of the other); TV =
// 1/2 |p_s - p_t|_1. (n, V) arrays in the accumulation dtype alive at once:
// at most five (log p_t and log p_s become p_t and nd in place, then u and
// one transient with the JSD), plus the output at T != 1 (where CE still
// needs softmax(z) at the end; at T = 1 z takes it).
void general_terms(const LossChunk& a, const TermPlan& plan, const at::Tensor& z,
                   const at::Tensor& lse, const at::Tensor& w) {
  const RowObjectives& o = a.obj;
  const double it = o.inv_temperature, b = o.jsd_beta, kl_w = plan.kl_w, rkl_w = plan.rkl_w;
  const bool jsd_mid = plan.jsd_mid, kl_val = plan.kl, rkl_val = plan.rkl;
  const bool need_nd = kl_val || rkl_val || jsd_mid, need_pt = kl_val || jsd_mid || o.tv != 0;
  const at::ScalarType acc = z.scalar_type();
  const at::Tensor t_acc = a.teacher.to(acc);
  at::Tensor lt = (it == 1.0 ? t_acc : t_acc * it).log_softmax(1);   // (n, V) log p_t
  at::Tensor ls = (it == 1.0 ? z : z * it).log_softmax(1);           // (n, V) log p_s
  const at::Tensor ps = ls.exp();                                    // (n, V)
  at::Tensor nd = need_nd ? at::sub_out(ls, lt, ls) : at::Tensor();  // (n, V) log p_t - log p_s
  ls = at::Tensor();
  const at::Tensor pt = need_pt ? lt.exp_() : at::Tensor();  // (n, V), in log p_t's storage
  lt = at::Tensor();
  at::Tensor l1;  // (n, V) log1p(beta u) = -log(p_s / m)
  if (jsd_mid) {
    at::Tensor l2 = nd.clamp(-80, 80);  // (n, V)
    at::Tensor u = at::expm1(l2);       // (n, V) p_t / p_s - 1
    // 1 + u as exp(nd), not from u: u rounds to -1 below nd ~ -17.
    at::div_out(l2, u, l2.exp_()).mul_(-(1 - b)).log1p_();  // -log(p_t / m)
    const at::Tensor kl_tm = -row_dot(pt, l2);              // KL(p_t || m)
    l2 = at::Tensor();
    l1 = u.mul_(b).log1p_();
    // beta KL(p_t || m) + (1 - beta) KL(p_s || m)
    a.jsd.copy_(b * kl_tm - (1 - b) * row_dot(ps, l1));
  }
  // (rkl_w != 0 implies rkl_val)
  if (kl_val || rkl_val) {
    const at::Tensor nd_star = nd.gather(1, a.argmax.unsqueeze(1));  // (n, 1) -d*
    nd.sub_(nd_star);                                                // -(d - d*)
    const at::Tensor star = nd_star.squeeze(1);
    if (kl_val) {
      const at::Tensor kl = row_dot(pt, nd) + star;  // KL(p_t || p_s)
      if (o.kl != 0) a.kl.copy_(kl);
      if (o.jsd != 0 && b == 0) a.jsd.copy_(kl);
    }
    if (rkl_val) {
      const at::Tensor rkl = -row_dot(ps, nd) - star;  // KL(p_s || p_t)
      if (o.reverse_kl != 0) a.reverse_kl.copy_(rkl);
      if (o.jsd != 0 && b == 1) a.jsd.copy_(rkl);
    }
  }
  at::Tensor sg;  // (n, V) sign(p_s - p_t)
  if (o.tv != 0) {
    sg = ps - pt;
    a.tv.copy_(at::linalg_vector_norm(sg, 1, at::IntArrayRef{1}).mul_(0.5));  // 1/2 |p_s - p_t|_1
    sg.sign_();
  }
  if (!a.want_grad) return;
  // G = w/T (rkl_w (d - d*) + jsd_w (1-beta) log(p_s / m) + tv_w sign/2), built in place.
  const at::Tensor s = w * it;  // (n, 1)
  at::Tensor G;
  auto add_term = [&](at::Tensor& t, double c) {
    if (G.defined())
      G.addcmul_(t, s * c);
    else
      G = t.mul_(s * c);
  };
  if (rkl_w != 0) add_term(nd, -rkl_w);
  if (jsd_mid) add_term(l1, -o.jsd * (1 - b));
  if (o.tv != 0) add_term(sg, 0.5 * o.tv);
  // z (the student logits, or their upcast) takes the gradient where nothing
  // reads it later (T = 1: softmax(z) is p_s).
  at::Tensor out = it == 1.0 ? z : at::empty_like(ps);  // (n, V)
  at::_softmax_backward_data_out(out, G, ps, 1, acc);   // p_s (G - sum p_s G)
  G = nd = l1 = sg = at::Tensor();
  const at::Tensor gce = w * o.ce;             // (n, 1)
  if (kl_w != 0) out.addcmul_(pt, s * -kl_w);  // forward KL: w/T kl_w (p_s - p_t)
  if (it == 1.0)
    out.addcmul_(ps, gce + s * kl_w);  // + w ce_w softmax(z)
  else {
    if (kl_w != 0) out.addcmul_(ps, s * kl_w);
    out.addcmul_(at::sub(z, lse).exp_(), gce);
  }
  out.scatter_add_(1, a.labels.unsqueeze(1), -gce);  // - w ce_w onehot
  if (!out.is_alias_of(a.student)) a.student.copy_(out);
}

// CE = logsumexp(z) - z[label]; the distillation terms of docs/LOSSES.md.
void chunk_rows_aten(const LossChunk& a) {
  const at::ScalarType acc = a.student.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor z = a.student.to(acc);       // (n, V): aliases student for fp32/fp64
  a.argmax.copy_(z.argmax(1));                  // first maximum
  const at::Tensor lse = z.logsumexp(1, true);  // (n, 1)
  a.ce.copy_((lse - z.gather(1, a.labels.unsqueeze(1))).squeeze(1));
  for (const at::Tensor& t : {a.kl, a.reverse_kl, a.jsd, a.tv}) t.zero_();
  const at::Tensor w = a.weights.to(acc).unsqueeze(1);  // (n, 1)
  const TermPlan plan = plan_terms(a.obj);
  if (a.teacher.defined() && plan.general()) return general_terms(a, plan, z, lse, w);
  const at::Tensor g = ce_and_kl(a, z, lse, w, plan.kl_w);
  if (a.want_grad) a.student.copy_(g);
}

}  // namespace

int64_t aten_row_slices(const RowObjectives& o) {
  return o.teacher() && plan_terms(o).jsd_mid ? 2 : 1;
}

void loss_rows_aten(const LossChunk& a) {
  const int64_t n = a.student.size(0), k = aten_row_slices(a.obj);
  if (k == 1 || n < 2 || !a.teacher.defined()) return chunk_rows_aten(a);
  const int64_t step = (n + k - 1) / k;
  for (int64_t r0 = 0; r0 < n; r0 += step) {
    const int64_t m = std::min(step, n - r0);
    auto rows = [&](const at::Tensor& t) { return t.narrow(0, r0, m); };
    chunk_rows_aten({rows(a.student), rows(a.teacher), rows(a.labels), rows(a.weights), a.obj,
                     a.want_grad, rows(a.ce), rows(a.kl), rows(a.reverse_kl), rows(a.jsd),
                     rows(a.tv), rows(a.argmax)});
  }
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
