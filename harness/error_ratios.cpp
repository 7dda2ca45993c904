#include "harness/error_ratios.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "harness/parity.h"
#include "harness/properties.h"
#include "harness/tolerance.h"
#include "optimized/step.h"

namespace dflash::harness {
namespace {

const char* dtype_of(const Tolerance& t) {
  for (DType d : {DType::kFloat64, DType::kFloat32, DType::kBFloat16})
    if (t.floor_rel == dtype_rule(d).tol.floor_rel) return dtype_name(d);
  return "other";
}

std::string kind_of(const std::string& name) {
  if (name.rfind("grad.", 0) == 0)
    return name == "grad.q" || name == "grad.k" || name == "grad.v" || name == "grad.student_hidden"
               ? name
               : "grad.(drafter params)";
  return name;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

struct Group {
  std::vector<double> ratio, needed_floor;
  double floor_rel = 0;
};

}  // namespace

std::string measure_error_ratios(int cases, uint64_t seed, std::string* json) {
  const optimized::Components real = optimized::real_components();
  std::map<std::tuple<std::string, std::string, std::string>, Group> groups;
  auto record = [&](const std::string& property, const std::vector<ErrorSample>& samples) {
    for (const ErrorSample& s : samples) {
      Group& g = groups[{property, dtype_of(s.tol), kind_of(s.name)}];
      g.floor_rel = s.tol.floor_rel;
      if (s.err_same > 0) g.ratio.push_back(s.err / s.err_same);
      if (s.scale > 0)
        g.needed_floor.push_back(std::max(0.0, s.err - s.tol.k * s.err_same) / s.scale);
    }
  };
  const PropertyRun run{cases, seed};
  {
    ErrorRecorder rec;
    check_step_parity(optimized::drafter_step, run);
    record("step", rec.samples);
  }
  {
    ErrorRecorder rec;
    check_loss_parity(real.loss, run);
    record("loss", rec.samples);
  }
  {
    ErrorRecorder rec;
    check_attention_parity(real.attention, run);
    record("attention", rec.samples);
  }
  std::string t = fmt::format(
      "error ratios of the real code ({} cases per property, seed {}): ratio = err / "
      "err(same-precision reference); needed floor = max(0, err - k err_same) / scale\n"
      "{:<10} {:<9} {:<24} {:>6} {:>8} {:>8} {:>8}  {:>11} {:>11} {:>9}\n",
      cases, seed, "property", "dtype", "tensor", "n", "ratio50", "ratio99", "ratioMax", "needed99",
      "neededMax", "floor");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [key, g] : groups) {
    const auto& [prop, dtype, kind] = key;
    t += fmt::format(
        "{:<10} {:<9} {:<24} {:>6} {:>8.3g} {:>8.3g} {:>8.3g}  {:>11.3g} {:>11.3g} {:>9.3g}\n",
        prop, dtype, kind, g.needed_floor.size(), quantile(g.ratio, 0.5), quantile(g.ratio, 0.99),
        quantile(g.ratio, 1.0), quantile(g.needed_floor, 0.99), quantile(g.needed_floor, 1.0),
        g.floor_rel);
    rows.push_back({{"property", prop},
                    {"dtype", dtype},
                    {"tensor", kind},
                    {"n", g.needed_floor.size()},
                    {"ratio_p50", quantile(g.ratio, 0.5)},
                    {"ratio_p99", quantile(g.ratio, 0.99)},
                    {"ratio_max", quantile(g.ratio, 1.0)},
                    {"needed_floor_p99", quantile(g.needed_floor, 0.99)},
                    {"needed_floor_max", quantile(g.needed_floor, 1.0)},
                    {"floor", g.floor_rel}});
  }
  if (json) *json = nlohmann::json({{"cases", cases}, {"seed", seed}, {"rows", rows}}).dump(2);
  return t;
}

}  // namespace dflash::harness
