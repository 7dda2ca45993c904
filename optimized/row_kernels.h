// Row kernels of the optimized build: plain C++ (no ATen) compiled at -O3
// with a vectorisable exp; each row is read a few times while it sits in
// cache, and no (rows, cols) temporary is ever allocated.
//
// loss_rows: the element-wise heart of the fused LM-head loss: for each row
// of a chunk of student logits (and teacher logits when a distillation term
// is on) it computes CE, the distillation terms (docs/LOSSES.md), the argmax
// and, in place, the gradient of the weighted loss with respect to the
// student logits. Callers guarantee labels in [0, V).
#pragma once

#include <cstdint>

namespace dflash::optimized {

enum class RowDtype { kFloat32, kFloat64, kBFloat16 };

// The objectives' weights (LossConfig without ATen): a term is computed when
// its weight is not 0 (jsd at beta 0 / 1 is the forward / reverse KL).
struct RowObjectives {
  double ce, kl, reverse_kl, jsd, jsd_beta, tv;
  double inv_temperature;  // 1 / T
  bool teacher() const { return kl != 0 || reverse_kl != 0 || jsd != 0 || tv != 0; }
};

// Which terms a row computes, by the objectives' weights: the jsd at beta 0
// / 1 is the forward / reverse KL (its weight joins that KL's gradient), in
// between it is the mixture JSD. Both row implementations follow it.
struct TermPlan {
  bool kl, rkl, jsd_mid, tv;  // values needed
  double kl_w, rkl_w;         // weights of the two KLs' gradients (jsd endpoints included)
  // Reverse KL, mixture JSD or TV: a second pass (host) or the
  // softmax-Jacobian form (ATen); else CE + forward KL's fused pass.
  bool general() const { return rkl || jsd_mid || tv; }
};
TermPlan plan_terms(const RowObjectives& o);

struct LossRows {
  RowDtype dtype;
  int64_t vocab;          // V, the row length
  void* student;          // (rows, V) logits; overwritten by dL/dlogits if want_grad
  const void* teacher;    // (rows, V) logits, or nullptr when no term needs the teacher
  const int64_t* labels;  // (rows)
  const double* weights;  // (rows) loss weight w
  RowObjectives obj;
  bool want_grad;
  double* ce;          // (rows) out: CE of each row
  double* kl;          // (rows) out: KL(p_t || p_s) of each row (0 when kl == 0)
  double* reverse_kl;  // (rows) out: KL(p_s || p_t) (0 when reverse_kl == 0)
  double* jsd;         // (rows) out: JSD_beta (0 when jsd == 0)
  double* tv;          // (rows) out: total variation (0 when tv == 0)
  int64_t* argmax;     // (rows) out: first index of the largest student logit
  // (rows) optional out, general path with want_grad: the sum of each row's
  // gradient, 0 analytically (every term is a softmax-Jacobian product); a
  // check for tests (row_kernels_test.cpp).
  double* grad_sum = nullptr;
  // The teacher rows are scratch (the fused loss's chunk buffer): the general
  // path may overwrite them (and the student rows) with per-element values
  // of its first pass, so that its gradient pass takes no exp. Float32 and
  // float64 rows only; bf16 rows are always recomputed.
  bool teacher_scratch = false;
};

// Processes rows [begin, end) of `a`. Thread-safe across disjoint ranges.
void loss_rows(const LossRows& a, int64_t begin, int64_t end);

// Attention tiles, rows of scores (R, T) in float or double (`dtype` is
// kFloat32 or kFloat64). Row i sees columns j < limit_i = clamp(limit[i] -
// offset, 0, T) (limit may be null: every column); masked columns get p = 0,
// and a row that sees nothing in a tile leaves its statistics unchanged.
struct AttentionRows {
  RowDtype dtype;
  int64_t rows, cols;    // R, T
  void* scores;          // (R, T) raw q.k in; probabilities out
  const int64_t* limit;  // (R) key limits, or nullptr
  int64_t offset;        // key index of column 0
  double scale;          // hd^-0.5
};

// Online softmax update: p = exp(scale*s - m_new) in place; m (R), l (R) and
// the accumulator rows acc (R, hd) are rescaled for the new row maxima.
void online_softmax_rows(const AttentionRows& a, void* m, void* l, void* acc, int64_t hd);

// Backward: p = exp(scale*s - lse) in place, and dP (R, T) becomes
// dS = p * (dP - D) (0 on masked columns).
void softmax_backward_rows(const AttentionRows& a, const void* lse, const void* D, void* dp);

// Exposed for tests: the float exp of the baseline clone (relative error
// < 1e-7 on [-87.3, 88.3]; clamped to exp(-87.3) below, +inf above 88.3).
float fast_expf(float x);
// log(1 + x) for x in [0, 1] (relative error < 2e-7): the log-sum-exp
// correction of the JSD mixture.
float fast_log1pf(float x);

}  // namespace dflash::optimized
