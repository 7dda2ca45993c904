// Finite-difference gradient check (libtorch has no gradcheck). The analytic
// gradient of a scalar loss w.r.t. named float64 parameters is compared, on a
// seeded random sample of entries per parameter, with a fourth-order central
// difference  [f(x-2h) - 8f(x-h) + 8f(x+h) - f(x+2h)] / 12h  (error O(h^4)),
// with h shrunk by 4 until two successive estimates agree (see .cpp).
//
// Relative error of an entry: |analytic - numeric| / max(|analytic|, |numeric|,
// floor), floor = rel_floor * (largest |analytic| entry of that parameter), so
// entries whose true gradient is ~0 are judged against the tensor's scale
// instead of dividing round-off by zero. The numerator is what the difference
// exceeds rounding by: |analytic - numeric| less 1.5 * 64 ulp * |loss| / h,
// the most that a few dozen ulps of error in each loss value can move the
// difference at the step h it settled on.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "core/weights.h"

namespace dflash::harness {

struct GradcheckOptions {
  int64_t samples_per_tensor = 8;  // all entries when the tensor is smaller
  double step = 1e-3;              // initial h, absolute (parameters are O(0.01 - 1))
  double tolerance = 1e-6;         // max relative error
  double rel_floor = 1e-3;
  uint64_t seed = 0;
};

struct GradcheckEntry {
  std::string name;
  int64_t index;  // flat index into the parameter
  double analytic, numeric, rel_err;
};

struct GradcheckReport {
  bool ok = true;
  double max_rel_err = 0;
  int64_t checked = 0;
  std::vector<GradcheckEntry> worst;  // the worst entry of each parameter
  std::string format() const;         // table of the worst entries
};

// `loss` recomputes the scalar loss from the current parameter values. The
// parameters must be float64 leaves with requires_grad.
GradcheckReport gradcheck(const std::function<at::Tensor()>& loss, const NamedTensors& params,
                          const GradcheckOptions& opt = {});

}  // namespace dflash::harness
