// The element-wise heart of the fused LM-head loss: for each row of a chunk
// of student logits (and teacher logits when the KL is on) it computes CE,
// KL, the argmax and, in place, the gradient of the weighted loss with
// respect to the student logits. Plain C++ (no ATen) so that it compiles at
// -O3 with a vectorisable exp; each row is read a few times while it sits in
// cache, and no (rows, V) temporary is ever allocated.
#pragma once

#include <cstdint>

namespace dflash::optimized {

enum class RowDtype { kFloat32, kFloat64, kBFloat16 };

struct LossRows {
  RowDtype dtype;
  int64_t vocab;             // V, the row length
  void* student;             // (rows, V) logits; overwritten by dL/dlogits if want_grad
  const void* teacher;       // (rows, V) logits, or nullptr when kl_weight == 0
  const int64_t* labels;     // (rows)
  const double* weights;     // (rows) loss weight w
  double ce_weight, kl_weight, inv_temperature;
  bool want_grad;
  double* ce;                // (rows) out: CE of each row
  double* kl;                // (rows) out: KL(p_t || p_s) of each row (0 without teacher)
  int64_t* argmax;           // (rows) out: first index of the largest student logit
};

// Processes rows [begin, end) of `a`. Thread-safe across disjoint ranges.
void loss_rows(const LossRows& a, int64_t begin, int64_t end);

// Exposed for tests: the float exp used by the kernel (max relative error
// ~2 ulp over the range that matters, clamped below at exp(-87.3)).
float fast_expf(float x);

}  // namespace dflash::optimized
