#include "harness/tolerance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace dflash::harness {
namespace {

// Test hook: DFLASH_TEST_FORCE_FAILURE=1 makes every comparison of real
// results fail (bound -1), so tests can drive the real kernels through the
// real failure path: report, counterexample file, replay, exit code.
bool forced_failure() {
  static const bool on = [] {
    const char* v = std::getenv("DFLASH_TEST_FORCE_FAILURE");
    return v && std::string(v) == "1";
  }();
  return on;
}

thread_local ErrorRecorder* g_recorder = nullptr;

}  // namespace

ErrorRecorder::ErrorRecorder() : previous_(g_recorder) { g_recorder = this; }
ErrorRecorder::~ErrorRecorder() { g_recorder = previous_; }

Comparison compare(const std::string& name, const at::Tensor& candidate,
                   const at::Tensor& same_precision, const at::Tensor& ref64,
                   const Tolerance& tol) {
  return compare(name, candidate, std::vector<at::Tensor>{same_precision}, ref64, tol);
}

Comparison compare(const std::string& name, const at::Tensor& candidate,
                   const std::vector<at::Tensor>& same_precision, const at::Tensor& ref64,
                   const Tolerance& tol) {
  return compare(name, candidate, same_precision, ref64, tol, at::Tensor());
}

Comparison compare(const std::string& name, const at::Tensor& candidate,
                   const std::vector<at::Tensor>& same_precision, const at::Tensor& ref64,
                   const Tolerance& tol, const at::Tensor& slack) {
  Comparison c;
  c.name = name;
  bool same_defined = true;
  for (const at::Tensor& t : same_precision) same_defined = same_defined && t.defined();
  if (!ref64.defined() || !candidate.defined() || !same_defined) {
    c.ok = !ref64.defined() && !candidate.defined();
    c.message = c.ok ? ""
                     : fmt::format("defined: candidate {}, same-precision {}, float64 {}",
                                   candidate.defined(), same_defined, ref64.defined());
    return c;
  }
  if (candidate.sizes() != ref64.sizes()) {
    c.message = fmt::format("shape ({}) vs reference ({})", fmt::join(candidate.sizes(), ", "),
                            fmt::join(ref64.sizes(), ", "));
    return c;
  }
  const at::Tensor r = ref64.detach().to(at::kDouble).reshape(-1);
  at::Tensor d = (candidate.detach().to(at::kDouble).reshape(-1) - r).abs();
  at::Tensor sl;
  if (slack.defined() && slack.numel() == d.numel()) {
    sl = slack.detach().to(at::kDouble).reshape(-1);
    d = (d - sl).clamp_min(0);
    c.max_slack = sl.numel() ? sl.max().item<double>() : 0.0;
  }
  const double scale = r.numel() ? r.abs().max().item<double>() : 0.0;
  if (d.numel() == 0) {
    c.ok = true;
    return c;
  }
  c.worst_index = d.argmax().item<int64_t>();
  c.shape = candidate.sizes().vec();
  c.err = d[c.worst_index].item<double>();
  for (const at::Tensor& t : same_precision)
    c.err_same = std::max(c.err_same,
                          (t.detach().to(at::kDouble).reshape(-1) - r).abs().max().item<double>());
  c.bound = tol.k * c.err_same + tol.floor_rel * scale + tol.floor_abs;
  c.rel_err = scale > 0 ? c.err / scale : c.err;
  c.worst_candidate = candidate.detach().to(at::kDouble).reshape(-1)[c.worst_index].item<double>();
  c.worst_reference = r[c.worst_index].item<double>();
  if (sl.defined()) c.slack = sl[c.worst_index].item<double>();
  if (g_recorder) g_recorder->samples.push_back({name, tol, c.err, c.err_same, scale});
  if (forced_failure()) c.bound = -1;  // the test hook above
  c.ok = std::isfinite(c.err) && c.err <= c.bound;
  return c;
}

double Comparison::error_ratio() const {
  if (err_same > 0) return err / err_same;
  return err > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

namespace {

// The flat index as coordinates of `shape`: "[1, 0, 3]".
std::string coordinates(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> at(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    const int64_t n = std::max<int64_t>(shape[i], 1);
    at[i] = flat % n;
    flat /= n;
  }
  return fmt::format("[{}]", fmt::join(at, ", "));
}

}  // namespace

std::string Comparison::describe() const {
  if (!message.empty()) return fmt::format("{:<44} {} {}", name, ok ? "ok  " : "FAIL", message);
  const std::string slack_note =
      max_slack > 0
          ? fmt::format(" (beyond a slack of up to {:.3e}; {:.3e} there)", max_slack, slack)
          : "";
  return fmt::format(
      "{:<44} {} max_abs {:.3e} <= {:.3e}? (same-precision {:.3e}, error ratio {:.3g}) rel "
      "{:.2e} worst {} {:.9g} vs {:.9g}{}",
      name, ok ? "ok  " : "FAIL", err, bound, err_same, error_ratio(), rel_err,
      coordinates(worst_index, shape), worst_candidate, worst_reference, slack_note);
}

bool ComparisonReport::ok() const {
  for (const auto& r : rows)
    if (!r.ok) return false;
  return true;
}

std::string ComparisonReport::format(const std::string& context) const {
  std::string s;
  for (const auto& r : rows) s += r.describe() + "\n";
  if (!ok() && !context.empty()) s += "config:\n" + context;
  return s;
}

std::vector<NamedOutputs> same_precision_runs(const std::function<NamedOutputs(uint64_t)>& run,
                                              const NamedOutputs& ref64, bool float64) {
  if (float64) return {ref64};
  return {run(0), run(1), run(2)};
}

namespace {
const at::Tensor& output(const NamedOutputs& o, const std::string& name) {
  for (const auto& [n, t] : o)
    if (n == name) return t;
  throw std::logic_error("compare_outputs: no output " + name);
}
}  // namespace

void compare_outputs(ComparisonReport& rep, const NamedOutputs& candidate,
                     const std::vector<NamedOutputs>& same, const NamedOutputs& ref64,
                     const std::function<Tolerance(const std::string&)>& tol_of,
                     const std::map<std::string, at::Tensor>& slack) {
  for (const auto& [name, cand] : candidate) {
    std::vector<at::Tensor> s;
    for (const NamedOutputs& r : same) s.push_back(output(r, name));
    const auto it = slack.find(name);
    rep.rows.push_back(compare(name, cand, s, output(ref64, name), tol_of(name),
                               it == slack.end() ? at::Tensor() : it->second));
  }
}

ComparisonReport compare_outputs(const NamedOutputs& candidate, const NamedOutputs& same,
                                 const NamedOutputs& ref64, const Tolerance& tol) {
  ComparisonReport rep;
  compare_outputs(rep, candidate, {same}, ref64, [&](const std::string&) { return tol; });
  return rep;
}

}  // namespace dflash::harness
