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
  if (std::isnan(v)) {
    p[i].x = 0x7fc0;
    return;
  }
  u += 0x7fff + ((u >> 16) & 1);
  p[i].x = uint16_t(u >> 16);
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

// d/dz_s of w * (ce_w * CE + kl_w * KL) = w * (ce_w * (softmax(z) - onehot(label))
//                                        + kl_w / T * (softmax(z/T) - p_t)),
// written over the student row; the KL is accumulated in the same pass so
// each exp is taken once. `same_t` (T == 1) shares softmax(z) and softmax(z/T).
template <typename T, typename Acc, bool same_t>
DFLASH_INLINE Acc grad_and_kl(T* zs, const T* zt, int64_t V, int64_t label, Acc lse, Acc lse_st,
                              Acc lse_tt, Acc inv_t, Acc gce, Acc gkl) {
  Acc kl = 0;
#pragma omp simd reduction(+ : kl)
  for (int64_t v = 0; v < V; ++v) {
    const Acc z = load(zs, v);
    const Acc log_pt = inv_t * load(zt, v) - lse_tt;
    const Acc log_ps = inv_t * z - lse_st;
    const Acc pt = exp_acc(log_pt);
    const Acc p = exp_acc(z - lse);
    const Acc ps = same_t ? p : exp_acc(log_ps);
    kl += pt * (log_pt - log_ps);
    // The one-hot term is subtracted in Acc precision, before the store:
    // with p ~ 1 at the label, bf16(p) - 1 would lose every digit.
    store(zs, v, gce * (p - Acc(v == label)) + gkl * (ps - pt));
  }
  return kl;
}

template <typename T, typename Acc>
DFLASH_INLINE Acc kl_only(const T* zs, const T* zt, int64_t V, Acc lse_st, Acc lse_tt, Acc inv_t) {
  Acc kl = 0;
#pragma omp simd reduction(+ : kl)
  for (int64_t v = 0; v < V; ++v) {
    const Acc log_pt = inv_t * load(zt, v) - lse_tt;
    kl += exp_acc(log_pt) * (log_pt - (inv_t * load(zs, v) - lse_st));
  }
  return kl;
}

template <typename T, typename Acc>
DFLASH_INLINE void one_row(const LossRows& a, int64_t r) {
  const int64_t V = a.vocab;
  T* zs = static_cast<T*>(a.student) + r * V;
  const T* zt = a.teacher ? static_cast<const T*>(a.teacher) + r * V : nullptr;
  const Acc inv_t = Acc(a.inv_temperature);
  const bool same_t = a.inv_temperature == 1.0;
  const RowMax<Acc> ms = row_max<T, Acc>(zs, V);
  a.argmax[r] = ms.index;
  // CE = logsumexp(z) - z[label]
  const int64_t label = a.labels[r];
  const Acc lse = ms.value + log_sum_exp_shifted<T, Acc>(zs, V, ms.value, Acc(1));
  a.ce[r] = double(lse - load(zs, label));
  const Acc w = Acc(a.weights[r]), gce = w * Acc(a.ce_weight), gkl = w * Acc(a.kl_weight) * inv_t;
  a.kl[r] = 0;
  if (zt) {
    // log p = z/T - (m/T + log sum exp((z - m)/T)) on both sides.
    const Acc mt = row_max<T, Acc>(zt, V).value;
    const Acc lse_st =
        same_t ? lse : inv_t * ms.value + log_sum_exp_shifted<T, Acc>(zs, V, ms.value, inv_t);
    const Acc lse_tt = inv_t * mt + log_sum_exp_shifted<T, Acc>(zt, V, mt, inv_t);
    Acc kl;
    if (!a.want_grad)
      kl = kl_only<T, Acc>(zs, zt, V, lse_st, lse_tt, inv_t);
    else if (same_t)
      kl = grad_and_kl<T, Acc, true>(zs, zt, V, label, lse, lse_st, lse_tt, inv_t, gce, gkl);
    else
      kl = grad_and_kl<T, Acc, false>(zs, zt, V, label, lse, lse_st, lse_tt, inv_t, gce, gkl);
    a.kl[r] = double(kl);
  } else if (a.want_grad) {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v)
      store(zs, v, gce * (exp_acc(load(zs, v) - lse) - Acc(v == label)));
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
