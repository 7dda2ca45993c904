#include "optimized/row_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dflash::optimized {
namespace {

__attribute__((always_inline)) inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
__attribute__((always_inline)) inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Cephes-style expf: range reduction by ln 2 with a magic-number round, a
// degree-5 polynomial, and the exponent written into the bits. Branch-free so
// GCC vectorises loops that call it.
__attribute__((always_inline)) inline float expf_inline(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + magic;
  const int32_t n = int32_t(float_to_bits(t)) - int32_t(float_to_bits(magic));
  const float fn = t - magic;
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * bits_to_float(uint32_t(n + 127) << 23);
}

// Storage <-> accumulation conversions. bf16 rounds to nearest even, as c10.
struct Bf16 {
  uint16_t x;
};
__attribute__((always_inline)) inline float load(const float* p, int64_t i) { return p[i]; }
__attribute__((always_inline)) inline double load(const double* p, int64_t i) { return p[i]; }
__attribute__((always_inline)) inline float load(const Bf16* p, int64_t i) {
  return bits_to_float(uint32_t(p[i].x) << 16);
}
__attribute__((always_inline)) inline void store(float* p, int64_t i, float v) { p[i] = v; }
__attribute__((always_inline)) inline void store(double* p, int64_t i, double v) { p[i] = v; }
__attribute__((always_inline)) inline void store(Bf16* p, int64_t i, float v) {
  uint32_t u = float_to_bits(v);
  u += 0x7fff + ((u >> 16) & 1);
  p[i].x = std::isnan(v) ? uint16_t(0x7fc0) : uint16_t(u >> 16);  // a select, not a branch
}
__attribute__((always_inline)) inline float exp_acc(float x) { return expf_inline(x); }
__attribute__((always_inline)) inline double exp_acc(double x) { return std::exp(x); }

template <typename Acc>
struct RowMax {
  Acc value;
  int64_t index;
};

#define DFLASH_INLINE inline __attribute__((always_inline))

// The max by a vectorised reduction, then its first index (like at::argmax).
template <typename T, typename Acc>
DFLASH_INLINE RowMax<Acc> row_max(const T* z, int64_t V) {
  Acc m = load(z, 0);
#pragma omp simd reduction(max : m)
  for (int64_t v = 1; v < V; ++v) m = std::max(m, Acc(load(z, v)));
  int64_t at = 0;  // bounded: a NaN maximum matches nothing
  while (at < V && !(Acc(load(z, at)) == m)) ++at;
  return {m, at < V ? at : 0};
}

// log sum_v exp(scale * (z_v - m)), m = max z (scale > 0, so the max of the
// scaled row is scale * m).
template <typename T, typename Acc>
DFLASH_INLINE Acc log_sum_exp_shifted(const T* z, int64_t V, Acc m, Acc scale) {
  Acc s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; ++v) s += exp_acc(scale * (load(z, v) - m));
  return std::log(s);
}

// The inputs of one row's terms: the logs every pass reads.
template <typename Acc>
struct RowLogs {
  Acc ms, mt;  // the rows' maxima (student, teacher)
  // Shifted by the max: lse = log sum exp(z - ms); lse_st, lse_tt = log sum
  // exp((z - m)/T) of the student and the teacher row.
  Acc lse, lse_st, lse_tt, inv_t;
  Acc log_beta, log_1m_beta;  // log beta, log(1 - beta) of the JSD mixture
  Acc beta, one_m_beta;       // beta, 1 - beta
  Acc d_star;                 // d at the student's argmax
};

// d/dz_s of w * (ce_w * CE + kl_w * KL) = w * (ce_w * (softmax(z) - onehot(label))
//                                        + kl_w / T * (softmax(z/T) - p_t)),
// written over the student row; the KL is accumulated in the same pass so
// each exp is taken once. `same_t` (T == 1) shares softmax(z) and softmax(z/T).
template <typename T, typename Acc, bool same_t>
DFLASH_INLINE Acc grad_and_kl(T* zs, const T* zt, int64_t V, int64_t label, const RowLogs<Acc>& lg,
                              Acc gce, Acc gkl) {
  const Acc ms = lg.ms, mt = lg.mt, lse = lg.lse, lse_st = lg.lse_st, lse_tt = lg.lse_tt,
            inv_t = lg.inv_t;
  Acc kl = 0;
#pragma omp simd reduction(+ : kl)
  for (int64_t v = 0; v < V; ++v) {
    const Acc z = load(zs, v);
    const Acc log_pt = inv_t * (load(zt, v) - mt) - lse_tt;
    const Acc log_ps = inv_t * (z - ms) - lse_st;
    const Acc pt = exp_acc(log_pt);
    const Acc p = exp_acc((z - ms) - lse);
    const Acc ps = same_t ? p : exp_acc(log_ps);
    kl += pt * (log_pt - log_ps);
    // The one-hot term is subtracted in Acc precision, before the store:
    // with p ~ 1 at the label, bf16(p) - 1 would lose every digit.
    store(zs, v, gce * (p - Acc(v == label)) + gkl * (ps - pt));
  }
  return kl;
}

template <typename T, typename Acc>
DFLASH_INLINE Acc kl_only(const T* zs, const T* zt, int64_t V, const RowLogs<Acc>& lg) {
  const Acc ms = lg.ms, mt = lg.mt, lse_st = lg.lse_st, lse_tt = lg.lse_tt, inv_t = lg.inv_t;
  Acc kl = 0;
#pragma omp simd reduction(+ : kl)
  for (int64_t v = 0; v < V; ++v) {
    const Acc log_pt = inv_t * (load(zt, v) - mt) - lse_tt;
    kl += exp_acc(log_pt) * (log_pt - (inv_t * (load(zs, v) - ms) - lse_st));
  }
  return kl;
}

// log(1 + x) = 2 atanh(s), s = x / (2 + x): for x in [0, 1], s in [0, 1/3],
// the odd series to s^15 (the first omitted term is < 2e-8 of the result),
// so tiny x stay exact (no 1 + x rounding).
DFLASH_INLINE float two_atanh(float s) {
  const float s2 = s * s;
  float p = 1.0f / 15;
  p = p * s2 + 1.0f / 13;
  p = p * s2 + 1.0f / 11;
  p = p * s2 + 1.0f / 9;
  p = p * s2 + 1.0f / 7;
  p = p * s2 + 1.0f / 5;
  p = p * s2 + 1.0f / 3;
  p = p * s2 + 1.0f;
  return 2.0f * s * p;
}
DFLASH_INLINE float log1p_acc(float x) { return two_atanh(x / (2.0f + x)); }
DFLASH_INLINE double log1p_acc(double x) { return std::log1p(x); }

// log(e^a + e^b), shifted by the larger side.
template <typename Acc>
DFLASH_INLINE Acc log_add_exp(Acc a, Acc b) {
  const Acc hi = std::max(a, b), lo = std::min(a, b);
  return hi + log1p_acc(exp_acc(lo - hi));
}

// log m of the JSD mixture m = a + b from both sides' logs (la, lb) and
// values (a = beta p_t, b = (1 - beta) p_s, both already computed): the
// larger side's log plus log1p(small / large) with s = small / (2 large +
// small), so no further exp and no log of an underflowed sum. (Below
// exp(-87.3) the fast exp clamps, which moves log m by at most log 2 where
// both sides weigh < 1e-38.) Float64 rows take the exact log-add-exp.
DFLASH_INLINE float log_mix(float la, float a, float lb, float b) {
  // max/min, not a select on a >= b (which GCC leaves scalar); the logs
  // order as the values do, up to a rounding that only swaps near-equals.
  const float hi = std::max(a, b), lo = std::min(a, b);
  return std::max(la, lb) + two_atanh(lo / (2.0f * hi + lo));
}
DFLASH_INLINE double log_mix(double la, double, double lb, double) { return log_add_exp(la, lb); }

// log(p_s / m), m = beta p_t + (1 - beta) p_s. Where the two nearly agree
// it is ~ beta (p_s - p_t) / p_s, far below the logs it would be the
// difference of (log p_s - log m rounds away its digits: the gradient's
// float32 error grew 10-30x near agreement); there 2 atanh(s) with s =
// (p_s - m) / (p_s + m) = beta (p_s - p_t) / (p_s + m), |s| <= 1/3, keeps
// them. Elsewhere the logs' difference is not small and is exact enough.
DFLASH_INLINE double two_atanh(double s) { return 2 * std::atanh(s); }
template <typename Acc>
DFLASH_INLINE Acc log_ps_over_m(Acc log_ps, Acc log_m, Acc ps, Acc pt, Acc m, Acc beta) {
  const Acc s = beta * (ps - pt) / (ps + m);
  return std::abs(s) <= Acc(1) / 3 ? two_atanh(s) : log_ps - log_m;
}

// Per-row sums of the general path, with log p = (z - m)/T - lse on both sides
// and d = log p_s - log p_t: KL(p_t || p_s); sum p_s (d - d*) with d* the d
// of the student's argmax (the reverse KL is d* + that sum, and its gradient
// p_s ((d - d*) - sum) never subtracts two large numbers); sum |p_s - p_t|;
// the student's mass where p_s > p_t, < p_t and == p_t (the TV gradient
// from sums of positives only); with the JSD's mixture m, KL(p_t || m) and
// KL(p_s || m).
template <typename Acc>
struct TermSums {
  Acc kl = 0, rkl_c = 0, l1 = 0, p_pos = 0, p_neg = 0, p_zero = 0, kl_tm = 0, kl_sm = 0;
};

// The general gradient, written over the student row (d/dz of each term,
// docs/LOSSES.md): CE w (p - onehot); forward KL w/T (p_s - p_t); reverse KL
// w/T p_s (d - RKL) = w/T p_s ((d - d*) - sum p_s (d - d*)); JSD w/T (1-beta)
// p_s (log p_s - log m - KL(p_s || m)); TV w/T p_s (sign(p_s - p_t) - E)/2,
// E = sum p_s sign(p_s - p_t), which is P_neg + P_zero/2 where p_s > p_t,
// -(P_pos + P_zero/2) where p_s < p_t and (P_neg - P_pos)/2 at ties.
template <typename Acc>
struct GradScales {
  Acc ce, kl, rkl, rkl_c, tv, tv_pos, tv_neg, tv_tie, jsd, kl_sm;
};

// What the first pass leaves in scratch rows for the gradient pass (with
// T == 1 the student row also gets p_s): kY, the part of the gradient its
// row sums do not change, Y = kl (p_s - p_t) + p_s (rkl ((d - d*)) + jsd
// (log p_s - log m) + tv sign(p_s - p_t)/2), so the gradient is Y + p_s c0
// with c0 from the sums; kD, d = p_s - p_t (TV alone: its gradient then
// takes the student's masses on each side, no 1/2 - E/2 cancellation).
enum class Cache { kNone, kY, kD };

template <typename T, typename Acc, bool jsd, bool tv, Cache cache, bool same_t>
DFLASH_INLINE TermSums<Acc> term_sums(T* zs, T* zt, int64_t V, const RowLogs<Acc> r,
                                      const GradScales<Acc> g) {
  Acc kl = 0, rkl_c = 0, l1 = 0, p_pos = 0, p_neg = 0, p_zero = 0, kl_tm = 0, kl_sm = 0;
#pragma omp simd reduction(+ : kl, rkl_c, l1, p_pos, p_neg, p_zero, kl_tm, kl_sm)
  for (int64_t v = 0; v < V; ++v) {
    const Acc log_ps = r.inv_t * (load(zs, v) - r.ms) - r.lse_st;
    const Acc log_pt = r.inv_t * (load(zt, v) - r.mt) - r.lse_tt;
    const Acc ps = exp_acc(log_ps), pt = exp_acc(log_pt), d = ps - pt;
    kl += pt * (log_pt - log_ps);
    rkl_c += ps * ((log_ps - log_pt) - r.d_star);
    if (tv) {
      l1 += std::abs(d);
      p_pos += ps * Acc(d > 0);
      p_neg += ps * Acc(d < 0);
      p_zero += ps * Acc(d == 0);
    }
    Acc y = g.kl * d + ps * (g.rkl * ((log_ps - log_pt) - r.d_star));
    // TV beside the reverse KL or JSD: its sign(d)/2 joins Y (its row-mean
    // share, -E/2, is c0's), as the reference's softmax Jacobian forms it.
    if (tv && cache == Cache::kY) y += ps * (g.tv * Acc(0.5) * (Acc(d > 0) - Acc(d < 0)));
    if (jsd) {
      const Acc log_m =
          log_mix(r.log_beta + log_pt, r.beta * pt, r.log_1m_beta + log_ps, r.one_m_beta * ps);
      kl_tm += pt * (log_pt - log_m);
      const Acc l_sm =
          log_ps_over_m(log_ps, log_m, ps, pt, r.beta * pt + r.one_m_beta * ps, r.beta);
      kl_sm += ps * l_sm;
      y += ps * (g.jsd * l_sm);
    }
    if (cache == Cache::kY) store(zt, v, y);
    if (cache == Cache::kD) store(zt, v, d);
    if (cache != Cache::kNone && same_t) store(zs, v, ps);
  }
  return {kl, rkl_c, l1, p_pos, p_neg, p_zero, kl_tm, kl_sm};
}

template <typename T, typename Acc, bool same_t, bool jsd>
DFLASH_INLINE Acc general_grad(T* zs, const T* zt, int64_t V, int64_t label, const RowLogs<Acc> r,
                               const GradScales<Acc> g) {
  // r and g by value: fields read through a reference could alias the row
  // being written, which keeps GCC from if-converting (vectorising) the loop.
  Acc sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) {
    const Acc z = load(zs, v);
    const Acc log_ps = r.inv_t * (z - r.ms) - r.lse_st;
    const Acc log_pt = r.inv_t * (load(zt, v) - r.mt) - r.lse_tt;
    const Acc ps = exp_acc(log_ps), pt = exp_acc(log_pt);
    const Acc p = same_t ? ps : exp_acc((z - r.ms) - r.lse);
    const Acc d = ps - pt;
    Acc inner = g.rkl * (((log_ps - log_pt) - r.d_star) - g.rkl_c) + g.tv * (d > 0   ? g.tv_pos
                                                                             : d < 0 ? g.tv_neg
                                                                                     : g.tv_tie);
    if (jsd) {
      const Acc log_m =
          log_mix(r.log_beta + log_pt, r.beta * pt, r.log_1m_beta + log_ps, r.one_m_beta * ps);
      const Acc l_sm =
          log_ps_over_m(log_ps, log_m, ps, pt, r.beta * pt + r.one_m_beta * ps, r.beta);
      inner += g.jsd * (l_sm - g.kl_sm);
    }
    const Acc grad = g.ce * (p - Acc(v == label)) + g.kl * (ps - pt) + ps * inner;
    sum += grad;
    store(zs, v, grad);
  }
  return sum;
}

// The gradient pass over what term_sums cached: no exp with T == 1.
template <typename T, typename Acc, bool same_t, Cache cache>
DFLASH_INLINE Acc cached_grad(T* zs, const T* zt, int64_t V, int64_t label, const RowLogs<Acc> r,
                              const GradScales<Acc> g) {
  // The sums' share, per unit p_s (TV's -E/2 = tv_tie; 0 without TV).
  const Acc c0 = g.tv * g.tv_tie - (g.rkl * g.rkl_c + g.jsd * g.kl_sm);
  Acc sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) {
    const Acc z = load(zs, v), c = load(zt, v);
    const Acc ps = same_t ? z : exp_acc(r.inv_t * (z - r.ms) - r.lse_st);
    const Acc p = same_t ? z : exp_acc((z - r.ms) - r.lse);
    const Acc rest = cache == Cache::kY ? c + ps * c0
                                        : g.kl * c + ps * (g.tv * (c > 0   ? g.tv_pos
                                                                   : c < 0 ? g.tv_neg
                                                                           : g.tv_tie));
    const Acc grad = g.ce * (p - Acc(v == label)) + rest;
    sum += grad;
    store(zs, v, grad);
  }
  return sum;
}

// The first pass, by what it computes and caches (kD: TV alone; kY: the rest).
template <typename T, typename Acc>
DFLASH_INLINE TermSums<Acc> first_pass(T* zs, T* zt, int64_t V, const RowLogs<Acc>& lg,
                                       const GradScales<Acc>& g, bool jsd, bool tv, Cache cache,
                                       bool same_t) {
  if (cache == Cache::kNone) {
    if (tv)
      return jsd ? term_sums<T, Acc, true, true, Cache::kNone, false>(zs, zt, V, lg, g)
                 : term_sums<T, Acc, false, true, Cache::kNone, false>(zs, zt, V, lg, g);
    return jsd ? term_sums<T, Acc, true, false, Cache::kNone, false>(zs, zt, V, lg, g)
               : term_sums<T, Acc, false, false, Cache::kNone, false>(zs, zt, V, lg, g);
  }
  if (cache == Cache::kD)
    return same_t ? term_sums<T, Acc, false, true, Cache::kD, true>(zs, zt, V, lg, g)
                  : term_sums<T, Acc, false, true, Cache::kD, false>(zs, zt, V, lg, g);
  if (tv) {  // with the reverse KL or the JSD
    if (jsd)
      return same_t ? term_sums<T, Acc, true, true, Cache::kY, true>(zs, zt, V, lg, g)
                    : term_sums<T, Acc, true, true, Cache::kY, false>(zs, zt, V, lg, g);
    return same_t ? term_sums<T, Acc, false, true, Cache::kY, true>(zs, zt, V, lg, g)
                  : term_sums<T, Acc, false, true, Cache::kY, false>(zs, zt, V, lg, g);
  }
  if (jsd)
    return same_t ? term_sums<T, Acc, true, false, Cache::kY, true>(zs, zt, V, lg, g)
                  : term_sums<T, Acc, true, false, Cache::kY, false>(zs, zt, V, lg, g);
  return same_t ? term_sums<T, Acc, false, false, Cache::kY, true>(zs, zt, V, lg, g)
                : term_sums<T, Acc, false, false, Cache::kY, false>(zs, zt, V, lg, g);
}

template <typename T, typename Acc>
DFLASH_INLINE Acc grad_pass(T* zs, const T* zt, int64_t V, int64_t label, const RowLogs<Acc>& lg,
                            const GradScales<Acc>& g, bool jsd, Cache cache, bool same_t) {
  if (cache == Cache::kY)
    return same_t ? cached_grad<T, Acc, true, Cache::kY>(zs, zt, V, label, lg, g)
                  : cached_grad<T, Acc, false, Cache::kY>(zs, zt, V, label, lg, g);
  if (cache == Cache::kD)
    return same_t ? cached_grad<T, Acc, true, Cache::kD>(zs, zt, V, label, lg, g)
                  : cached_grad<T, Acc, false, Cache::kD>(zs, zt, V, label, lg, g);
  if (jsd)
    return same_t ? general_grad<T, Acc, true, true>(zs, zt, V, label, lg, g)
                  : general_grad<T, Acc, false, true>(zs, zt, V, label, lg, g);
  return same_t ? general_grad<T, Acc, true, false>(zs, zt, V, label, lg, g)
                : general_grad<T, Acc, false, false>(zs, zt, V, label, lg, g);
}

// The general path of one row (reverse KL, JSD or TV on): a pass for the
// sums, then, for the gradient, a second pass (the reverse KL, the JSD and
// the TV gradients need their row's sums); with scratch rows the first pass
// caches what the second would recompute.
template <typename T, typename Acc>
DFLASH_INLINE void general_row(const LossRows& a, int64_t r, T* zs, const T* zt, int64_t label,
                               const RowLogs<Acc>& lg, Acc w, bool same_t) {
  const RowObjectives& o = a.obj;
  const TermPlan plan = plan_terms(o);
  const int64_t V = a.vocab;
  const double b = o.jsd_beta;
  const Acc it = lg.inv_t;
  GradScales<Acc> g{w * Acc(o.ce),
                    w * Acc(plan.kl_w) * it,
                    w * Acc(plan.rkl_w) * it,
                    Acc(0),
                    w * Acc(o.tv) * it,
                    Acc(0),
                    Acc(0),
                    Acc(0),
                    plan.jsd_mid ? w * Acc(o.jsd * (1 - b)) * it : Acc(0),
                    Acc(0)};
  const bool can_cache = a.want_grad && a.teacher_scratch && sizeof(T) == sizeof(Acc);
  const Cache cache = !can_cache                              ? Cache::kNone
                      : plan.tv && !plan.rkl && !plan.jsd_mid ? Cache::kD
                                                              : Cache::kY;
  T* zt_w = const_cast<T*>(zt);  // written only with teacher_scratch (cache != kNone)
  const TermSums<Acc> s =
      first_pass<T, Acc>(zs, zt_w, V, lg, g, plan.jsd_mid, plan.tv, cache, same_t);
  const double jsd = plan.jsd_mid      ? b * double(s.kl_tm) + (1 - b) * double(s.kl_sm)
                     : o.jsd_beta == 0 ? double(s.kl)
                                       : double(lg.d_star) + double(s.rkl_c);
  a.kl[r] = o.kl != 0 ? double(s.kl) : 0.0;
  a.reverse_kl[r] = o.reverse_kl != 0 ? double(lg.d_star) + double(s.rkl_c) : 0.0;
  a.jsd[r] = o.jsd != 0 ? jsd : 0.0;
  a.tv[r] = o.tv != 0 ? 0.5 * double(s.l1) : 0.0;
  if (!a.want_grad) return;
  g.rkl_c = s.rkl_c;
  g.tv_pos = s.p_neg + Acc(0.5) * s.p_zero;
  g.tv_neg = -(s.p_pos + Acc(0.5) * s.p_zero);
  g.tv_tie = Acc(0.5) * (s.p_neg - s.p_pos);
  g.kl_sm = s.kl_sm;
  const Acc sum = grad_pass<T, Acc>(zs, zt, V, label, lg, g, plan.jsd_mid, cache, same_t);
  if (a.grad_sum) a.grad_sum[r] = double(sum);
}

template <typename T, typename Acc>
DFLASH_INLINE void one_row(const LossRows& a, int64_t r) {
  const int64_t V = a.vocab;
  T* zs = static_cast<T*>(a.student) + r * V;
  const T* zt = a.teacher ? static_cast<const T*>(a.teacher) + r * V : nullptr;
  const Acc inv_t = Acc(a.obj.inv_temperature);
  const bool same_t = a.obj.inv_temperature == 1.0;
  const RowMax<Acc> ms = row_max<T, Acc>(zs, V);
  a.argmax[r] = ms.index;
  // CE = logsumexp(z) - z[label]
  const int64_t label = a.labels[r];
  // Every log p below is (z - max)/T - log sum exp((z - max)/T): z/T - lse
  // would round z/T and lse, each as large as the logits, and lose the
  // digits that p_s - p_t keeps where the two distributions nearly agree.
  const Acc lse = log_sum_exp_shifted<T, Acc>(zs, V, ms.value, Acc(1));  // shifted by the max
  a.ce[r] = double((ms.value - load(zs, label)) + lse);
  a.kl[r] = a.reverse_kl[r] = a.jsd[r] = a.tv[r] = 0;
  const TermPlan plan = plan_terms(a.obj);
  const Acc w = Acc(a.weights[r]), gce = w * Acc(a.obj.ce), gkl = w * Acc(plan.kl_w) * inv_t;
  if (zt) {
    // log p = (z - m)/T - log sum exp((z - m)/T) on both sides.
    const Acc mt = row_max<T, Acc>(zt, V).value;
    const Acc lse_st = same_t ? lse : log_sum_exp_shifted<T, Acc>(zs, V, ms.value, inv_t);
    const Acc lse_tt = log_sum_exp_shifted<T, Acc>(zt, V, mt, inv_t);
    RowLogs<Acc> lg{};
    lg.ms = ms.value, lg.mt = mt, lg.lse = lse, lg.lse_st = lse_st, lg.lse_tt = lse_tt;
    lg.inv_t = inv_t;
    if (plan.general()) {  // the general terms' logs: only they read them
      const double b = a.obj.jsd_beta;
      lg.log_beta = plan.jsd_mid ? Acc(std::log(b)) : Acc(0);
      lg.log_1m_beta = plan.jsd_mid ? Acc(std::log1p(-b)) : Acc(0);
      lg.beta = Acc(b), lg.one_m_beta = Acc(1 - b);
      lg.d_star = -lse_st - (inv_t * (load(zt, ms.index) - mt) - lse_tt);
      return general_row<T, Acc>(a, r, zs, zt, label, lg, w, same_t);
    }
    // CE + forward KL only: one fused pass.
    Acc kl;
    if (!a.want_grad)
      kl = kl_only<T, Acc>(zs, zt, V, lg);
    else if (same_t)
      kl = grad_and_kl<T, Acc, true>(zs, zt, V, label, lg, gce, gkl);
    else
      kl = grad_and_kl<T, Acc, false>(zs, zt, V, label, lg, gce, gkl);
    a.kl[r] = a.obj.kl != 0 ? double(kl) : 0.0;
    a.jsd[r] = a.obj.jsd != 0 ? double(kl) : 0.0;  // jsd at beta = 0
  } else if (a.want_grad) {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v)
      store(zs, v, gce * (exp_acc((load(zs, v) - ms.value) - lse) - Acc(v == label)));
  }
}

// One clone per instruction set on x86-64 (chosen at load time); elsewhere
// the compiler's baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define DFLASH_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DFLASH_CLONES
#endif

DFLASH_CLONES void rows_f32(const LossRows& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) one_row<float, float>(a, r);
}
DFLASH_CLONES void rows_bf16(const LossRows& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) one_row<Bf16, float>(a, r);
}
void rows_f64(const LossRows& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) one_row<double, double>(a, r);
}

DFLASH_INLINE int64_t row_limit(const AttentionRows& a, int64_t i) {
  return a.limit ? std::max<int64_t>(0, std::min(a.cols, a.limit[i] - a.offset)) : a.cols;
}

template <typename A>
DFLASH_INLINE void online_rows(const AttentionRows& a, A* m, A* l, A* acc, int64_t hd) {
  const A scale = A(a.scale);
  for (int64_t i = 0; i < a.rows; ++i) {
    A* row = static_cast<A*>(a.scores) + i * a.cols;
    const int64_t lim = row_limit(a, i);
    if (lim == 0) {  // nothing visible in this tile: statistics unchanged
      for (int64_t j = 0; j < a.cols; ++j) row[j] = 0;
      continue;
    }
    A mt = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : mt)
    for (int64_t j = 0; j < lim; ++j) mt = std::max(mt, scale * row[j]);
    const A m_new = std::max(m[i], mt);
    // exp(-inf) rescales nothing on a row's first tile (its acc and l are 0).
    const A alpha = m[i] == -std::numeric_limits<A>::infinity() ? A(0) : exp_acc(m[i] - m_new);
    A sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < lim; ++j) {
      row[j] = exp_acc(scale * row[j] - m_new);
      sum += row[j];
    }
    for (int64_t j = lim; j < a.cols; ++j) row[j] = 0;
    l[i] = l[i] * alpha + sum;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) acc[i * hd + d] *= alpha;
    m[i] = m_new;
  }
}

template <typename A>
DFLASH_INLINE void backward_rows(const AttentionRows& a, const A* lse, const A* D, A* dp) {
  const A scale = A(a.scale);
  for (int64_t i = 0; i < a.rows; ++i) {
    A* row = static_cast<A*>(a.scores) + i * a.cols;
    A* drow = dp + i * a.cols;
    const int64_t lim = row_limit(a, i);
#pragma omp simd
    for (int64_t j = 0; j < lim; ++j) {
      const A p = exp_acc(scale * row[j] - lse[i]);
      row[j] = p;
      drow[j] = p * (drow[j] - D[i]);
    }
    for (int64_t j = lim; j < a.cols; ++j) row[j] = drow[j] = 0;
  }
}

DFLASH_CLONES void online_f32(const AttentionRows& a, void* m, void* l, void* acc, int64_t hd) {
  online_rows<float>(a, static_cast<float*>(m), static_cast<float*>(l), static_cast<float*>(acc),
                     hd);
}
DFLASH_CLONES void backward_f32(const AttentionRows& a, const void* lse, const void* D, void* dp) {
  backward_rows<float>(a, static_cast<const float*>(lse), static_cast<const float*>(D),
                       static_cast<float*>(dp));
}

}  // namespace

TermPlan plan_terms(const RowObjectives& o) {
  const bool j0 = o.jsd != 0 && o.jsd_beta == 0, j1 = o.jsd != 0 && o.jsd_beta == 1;
  TermPlan p;
  p.kl = o.kl != 0 || j0;
  p.rkl = o.reverse_kl != 0 || j1;
  p.jsd_mid = o.jsd != 0 && !j0 && !j1;
  p.tv = o.tv != 0;
  p.kl_w = o.kl + (j0 ? o.jsd : 0.0);
  p.rkl_w = o.reverse_kl + (j1 ? o.jsd : 0.0);
  return p;
}

void online_softmax_rows(const AttentionRows& a, void* m, void* l, void* acc, int64_t hd) {
  if (a.dtype == RowDtype::kFloat64)
    return online_rows<double>(a, static_cast<double*>(m), static_cast<double*>(l),
                               static_cast<double*>(acc), hd);
  online_f32(a, m, l, acc, hd);
}

void softmax_backward_rows(const AttentionRows& a, const void* lse, const void* D, void* dp) {
  if (a.dtype == RowDtype::kFloat64)
    return backward_rows<double>(a, static_cast<const double*>(lse), static_cast<const double*>(D),
                                 static_cast<double*>(dp));
  backward_f32(a, lse, D, dp);
}

float fast_expf(float x) { return expf_inline(x); }
float fast_log1pf(float x) { return log1p_acc(x); }

void loss_rows(const LossRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case RowDtype::kFloat32:
      return rows_f32(a, begin, end);
    case RowDtype::kFloat64:
      return rows_f64(a, begin, end);
    case RowDtype::kBFloat16:
      return rows_bf16(a, begin, end);
  }
}

}  // namespace dflash::optimized
