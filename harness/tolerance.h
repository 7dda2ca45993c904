// The project's tolerance rule (DEVELOPERS.md): per tensor,
//   err(candidate vs float64 reference) <= k * err(same-precision reference
//                                          vs float64 reference) + floor,
// err = max |x - ref64|, floor = floor_rel * max |ref64| + floor_abs. A float64 candidate
// faces err(same) = 0, i.e. floor alone ("float64 tight").
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dflash::harness {

struct Tolerance {
  double k = 2.0;           // how much worse than the same-precision reference
  double floor_rel = 1e-9;  // relative to the reference's largest magnitude
  double floor_abs = 0.0;   // absolute (loss terms: nats, whose summands are ~1)
};

struct Comparison {
  std::string name;
  bool ok = false;
  double err = 0;              // max |candidate - ref64|
  double err_same = 0;         // max |same-precision reference - ref64|
  double bound = 0;            // k * err_same + floor
  double rel_err = 0;          // err / max |ref64|
  int64_t worst_index = -1;    // flat index into the tensor
  std::vector<int64_t> shape;  // to name the worst element by its coordinates
  double worst_candidate = 0, worst_reference = 0;
  double slack = 0;      // the elementwise slack taken off at the worst index
  double max_slack = 0;  // the largest slack of the tensor (0: none applied)
  std::string message;   // filled when the comparison could not be made
  // err / err_same: how many times the same-precision reference's own error
  // the candidate's is (the quantity the tolerance k bounds; inf when the
  // reference is exact).
  double error_ratio() const;
  std::string describe() const;
};

Comparison compare(const std::string& name, const at::Tensor& candidate,
                   const at::Tensor& same_precision, const at::Tensor& ref64, const Tolerance& tol);
// err(same) is the worst over several same-precision reference runs: the
// reference's own run and runs whose inputs were perturbed at the rounding
// level of that precision, so an ill-conditioned case widens its own bound.
Comparison compare(const std::string& name, const at::Tensor& candidate,
                   const std::vector<at::Tensor>& same_precision, const at::Tensor& ref64,
                   const Tolerance& tol);
// With `slack` (the candidate's shape, >= 0, or undefined for none): an
// elementwise allowance for a known discontinuity, computed exactly from the
// float64 reference (harness/parity.h: tv_sign_slack, hidden_state_slack); each element's
// |candidate - ref64| is reduced by its slack before the rule above applies.
Comparison compare(const std::string& name, const at::Tensor& candidate,
                   const std::vector<at::Tensor>& same_precision, const at::Tensor& ref64,
                   const Tolerance& tol, const at::Tensor& slack);

// All comparisons of a case, and a table of them; `context` (e.g. the config
// as TOML) is printed under a failure.
// The error-ratio measurement (docs/HARNESS.md): while a recorder is alive,
// every compare() on its thread appends its figures, so the tolerances can
// be set from the distribution the correct code produces.
struct ErrorSample {
  std::string name;  // tensor name
  Tolerance tol;     // the rule it was held to (identifies the dtype rule)
  double err = 0, err_same = 0, scale = 0;
};
class ErrorRecorder {
 public:
  ErrorRecorder();
  ~ErrorRecorder();
  ErrorRecorder(const ErrorRecorder&) = delete;
  ErrorRecorder& operator=(const ErrorRecorder&) = delete;
  std::vector<ErrorSample> samples;

 private:
  ErrorRecorder* previous_;
};

struct ComparisonReport {
  std::vector<Comparison> rows;
  bool ok() const;
  std::string format(const std::string& context = "") const;
};

// The outputs of one run by name ("loss", "grad.q", ...), in a fixed order.
using NamedOutputs = std::vector<std::pair<std::string, at::Tensor>>;

// The same-precision reference runs of a comparison: in float64 the float64
// reference itself; below, `run(jitter)` three times, as given (jitter 0)
// and on inputs perturbed at the dtype's rounding level (jitter 1 and 2):
// one run alone can round luckily well on a small case and set a bound below
// the dtype's real noise.
std::vector<NamedOutputs> same_precision_runs(const std::function<NamedOutputs(uint64_t)>& run,
                                              const NamedOutputs& ref64, bool float64);

// Each output of `candidate` against the float64 reference's of the same
// name, under the rule above with `tol_of(name)`, err(same) the worst over
// `same`, and `slack` (by name; none when absent) taken off elementwise.
// Appends one row per output, in the candidate's order.
void compare_outputs(ComparisonReport& rep, const NamedOutputs& candidate,
                     const std::vector<NamedOutputs>& same, const NamedOutputs& ref64,
                     const std::function<Tolerance(const std::string&)>& tol_of,
                     const std::map<std::string, at::Tensor>& slack = {});
// One tolerance for every output.
ComparisonReport compare_outputs(const NamedOutputs& candidate, const NamedOutputs& same,
                                 const NamedOutputs& ref64, const Tolerance& tol);

}  // namespace dflash::harness
