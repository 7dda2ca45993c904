#include "harness/gradcheck.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/batch.h"

namespace dflash::harness {
namespace {

std::vector<int64_t> sample_indices(int64_t numel, int64_t k, Rng& rng) {
  std::vector<int64_t> idx;
  if (numel <= k) {
    for (int64_t i = 0; i < numel; ++i) idx.push_back(i);
    return idx;
  }
  std::set<int64_t> seen;
  while (int64_t(seen.size()) < k) seen.insert(int64_t(rng.below(uint64_t(numel))));
  return {seen.begin(), seen.end()};
}

// Fourth-order central difference at step h.
double central_difference(const std::function<at::Tensor()>& loss, double* p, double h) {
  const double x0 = *p;
  auto f = [&](double x) {
    *p = x;
    return loss().item<double>();
  };
  const double d = (f(x0 - 2 * h) - 8 * f(x0 - h) + 8 * f(x0 + h) - f(x0 + 2 * h)) / (12 * h);
  *p = x0;
  return d;
}

// Shrinks h by 4 (truncation error by 256) until two successive estimates
// agree to a tenth of the tolerance, so strongly curved spots (a per-head
// RMSNorm over 2 elements) are not mistaken for wrong gradients. When they
// never agree, round-off has taken over: return the estimate whose change
// from its predecessor was smallest (Ridders' rule of thumb).
struct Estimate {
  double value, h;  // the derivative and the step it was taken at
};
Estimate numeric_derivative(const std::function<at::Tensor()>& loss, at::Tensor& flat, int64_t i,
                            const GradcheckOptions& opt, double floor) {
  at::NoGradGuard no_grad;
  double* p = flat.data_ptr<double>() + i;
  double h = opt.step, prev = central_difference(loss, p, h);
  Estimate best{prev, h};
  double best_change = INFINITY;
  for (int refine = 0; refine < 4; ++refine) {
    h /= 4;
    const double cur = central_difference(loss, p, h);
    const double change = std::abs(cur - prev);
    if (change <= 0.1 * opt.tolerance * std::max(std::abs(cur), floor)) return {cur, h};
    if (change < best_change)
      best = {cur, h}, best_change = change;
    else
      break;  // estimates diverging: round-off dominates from here on
    prev = cur;
  }
  return best;
}

// What rounding alone can put into a difference at step h: the stencil's
// weights sum to 18 / 12h, each loss value carries an evaluation error of a
// few dozen ulps of |loss| (a float64 forward pass of sums, exp and log; 64
// is the budget). A parameter whose whole gradient is ~1e-6 of a loss of ~1
// (a 2-wide head's q_proj) has differences no better than ~1e-12 absolute,
// a relative 1e-6: nightly seed 20261207 found one (q_proj.weight[2],
// -1.046750e-06 vs -1.046751e-06).
double roundoff(double loss_value, double h) {
  constexpr double kUlps = 64;
  return 1.5 * kUlps * std::numeric_limits<double>::epsilon() * std::abs(loss_value) / h;
}

// One entry: the central difference against the analytic value, less what
// rounding explains, relative to the larger of the two or the floor.
GradcheckEntry check_entry(const std::function<at::Tensor()>& loss, at::Tensor& flat, int64_t i,
                           double analytic, double loss_value, const GradcheckOptions& opt,
                           double floor) {
  const Estimate est = numeric_derivative(loss, flat, i, opt, floor);
  const double excess = std::max(0.0, std::abs(analytic - est.value) - roundoff(loss_value, est.h));
  const double err = excess / std::max({std::abs(analytic), std::abs(est.value), floor});
  return {"", i, analytic, est.value, err};
}

}  // namespace

GradcheckReport gradcheck(const std::function<at::Tensor()>& loss, const NamedTensors& params,
                          const GradcheckOptions& opt) {
  std::vector<at::Tensor> leaves;
  for (const auto& [name, t] : params) {
    TORCH_CHECK(t.scalar_type() == at::kDouble && t.requires_grad() && t.is_leaf(),
                "gradcheck: ", name, " must be a float64 leaf that requires grad");
    TORCH_CHECK(t.is_contiguous(), "gradcheck: ", name, " must be contiguous");
    leaves.push_back(t);
  }
  const at::Tensor l = loss();
  const double loss_value = l.item<double>();
  const auto grads = torch::autograd::grad({l}, leaves, {}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
  Rng rng(opt.seed);
  GradcheckReport rep;
  for (size_t p = 0; p < params.size(); ++p) {
    const std::string& name = params[p].first;
    at::Tensor g = grads[p].defined() ? grads[p].contiguous() : at::zeros_like(leaves[p]);
    const double* ga = g.data_ptr<double>();
    const double floor = opt.rel_floor * g.abs().max().item<double>() + 1e-300;
    at::Tensor flat = leaves[p].detach().view(-1);  // shares storage with the leaf
    GradcheckEntry worst{name, -1, 0, 0, -1};
    for (int64_t i : sample_indices(flat.numel(), opt.samples_per_tensor, rng)) {
      GradcheckEntry e = check_entry(loss, flat, i, ga[i], loss_value, opt, floor);
      // A kink (TV's |p_s - p_t|) within the stencil's reach averages two
      // slopes, and the step refinement can take that for round-off: a
      // mismatch is measured again from a 100x smaller step, and the
      // better of the two stands (a wrong gradient fails both).
      if (e.rel_err > opt.tolerance) {
        GradcheckOptions fine = opt;
        fine.step = opt.step / 100;
        const GradcheckEntry again = check_entry(loss, flat, i, ga[i], loss_value, fine, floor);
        if (again.rel_err < e.rel_err) e = again;
      }
      e.name = name;
      ++rep.checked;
      if (e.rel_err > worst.rel_err) worst = e;
    }
    rep.max_rel_err = std::max(rep.max_rel_err, worst.rel_err);
    if (worst.rel_err > opt.tolerance) rep.ok = false;
    rep.worst.push_back(worst);
  }
  return rep;
}

std::string GradcheckReport::format() const {
  std::string s = fmt::format("gradcheck: {} ({} entries, max relative error {:.3e})\n",
                              ok ? "ok" : "FAILED", checked, max_rel_err);
  s += fmt::format("  {:<44} {:>8} {:>14} {:>14} {:>10}\n", "parameter", "index", "analytic",
                   "numeric", "rel err");
  for (const auto& e : worst)
    s += fmt::format("  {:<44} {:>8} {:>14.6e} {:>14.6e} {:>10.2e}\n", e.name, e.index, e.analytic,
                     e.numeric, e.rel_err);
  return s;
}

}  // namespace dflash::harness
