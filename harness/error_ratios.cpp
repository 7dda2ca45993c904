#include "harness/error_ratios.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <functional>
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

using Groups = std::map<std::tuple<std::string, std::string, std::string>, Group>;

void record(Groups& groups, const std::string& property, const std::vector<ErrorSample>& samples) {
  for (const ErrorSample& s : samples) {
    Group& g = groups[{property, dtype_of(s.tol), kind_of(s.name)}];
    g.floor_rel = s.tol.floor_rel;
    if (s.err_same > 0) g.ratio.push_back(s.err / s.err_same);
    if (s.scale > 0) g.needed_floor.push_back(std::max(0.0, s.err - s.tol.k * s.err_same) / s.scale);
  }
}

// The table (groups without a nonzero sample, such as a term whose weight
// is 0, left out) and its JSON.
std::string table(const std::string& title, int width, const Groups& groups, int cases,
                  uint64_t seed, std::string* json) {
  std::string t = fmt::format(
      "{} ({} cases per property, seed {}): ratio = err / err(same-precision reference); "
      "needed floor = max(0, err - k err_same) / scale\n"
      "{:<{}} {:<9} {:<24} {:>6} {:>8} {:>8} {:>8}  {:>11} {:>11} {:>9}\n",
      title, cases, seed, "property", width, "dtype", "tensor", "n", "ratio50", "ratio99",
      "ratioMax", "needed99", "neededMax", "floor");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [key, g] : groups) {
    if (g.needed_floor.empty()) continue;
    const auto& [prop, dtype, kind] = key;
    t += fmt::format(
        "{:<{}} {:<9} {:<24} {:>6} {:>8.3g} {:>8.3g} {:>8.3g}  {:>11.3g} {:>11.3g} {:>9.3g}\n",
        prop, width, dtype, kind, g.needed_floor.size(), quantile(g.ratio, 0.5),
        quantile(g.ratio, 0.99), quantile(g.ratio, 1.0), quantile(g.needed_floor, 0.99),
        quantile(g.needed_floor, 1.0), g.floor_rel);
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

void only(LossConfig& l) {
  l.ce_weight = l.kl_weight = l.reverse_kl_weight = l.jsd_weight = l.tv_weight = 0;
}

// One objective or weighting per row of the per-objective table; the
// temperature (and, for the objectives, the weighting) stays drawn.
const std::pair<const char*, std::function<void(LossConfig&)>> kObjectives[] = {
    {"ce+kl", [](LossConfig& l) { only(l), l.ce_weight = 1, l.kl_weight = 1; }},
    {"kl", [](LossConfig& l) { only(l), l.kl_weight = 1; }},
    {"reverse_kl", [](LossConfig& l) { only(l), l.reverse_kl_weight = 1; }},
    {"jsd(0.5)", [](LossConfig& l) { only(l), l.jsd_weight = 1, l.jsd_beta = 0.5; }},
    {"jsd(0.1)", [](LossConfig& l) { only(l), l.jsd_weight = 1, l.jsd_beta = 0.1; }},
    {"tv", [](LossConfig& l) { only(l), l.tv_weight = 1; }},
    {"ce+kl dpace",
     [](LossConfig& l) {
       only(l), l.ce_weight = 1, l.kl_weight = 1;
       l.weighting = Weighting::kDpace, l.dpace_alpha = 0.5;
     }},
    {"ce+kl uniform",
     [](LossConfig& l) {
       only(l), l.ce_weight = 1, l.kl_weight = 1;
       l.weighting = Weighting::kUniform, l.gamma = 0;
     }},
};

}  // namespace

std::string measure_error_ratios(int cases, uint64_t seed, std::string* json) {
  const optimized::Components real = optimized::real_components();
  Groups groups;
  const PropertyRun run{cases, seed};
  {
    ErrorRecorder rec;
    check_step_parity(optimized::drafter_step, run);
    record(groups, "step", rec.samples);
  }
  {
    ErrorRecorder rec;
    check_loss_parity(real.loss, run);
    record(groups, "loss", rec.samples);
  }
  {
    ErrorRecorder rec;
    check_attention_parity(real.attention, run);
    record(groups, "attention", rec.samples);
  }
  return table("error ratios of the real code", 10, groups, cases, seed, json);
}

std::string measure_objective_error_ratios(int cases, uint64_t seed, std::string* json) {
  const optimized::Components real = optimized::real_components();
  Groups groups;
  const PropertyRun run{cases, seed};
  std::string failures;
  for (const auto& [name, set] : kObjectives)
    for (const bool near : {false, true})
      for (const DType dt : {DType::kFloat32, DType::kBFloat16}) {
        ErrorRecorder rec;
        const std::string prop = fmt::format("{} {}", name, near ? "near" : "random");
        const PropertyOutcome o =
            check_loss_parity(real.loss, run, "parity.loss", LossCaseOverride{set, dt, near});
        record(groups, prop, rec.samples);
        if (!o.passed)
          failures += fmt::format("FAILED {} {} after {} cases ({}):\n{}\n{}\n", prop,
                                  dtype_name(dt), o.cases_passed, o.size, o.report,
                                  o.counterexample);
      }
  return failures + table(
      "error ratios of the fused loss per objective (random: independent student and teacher; "
      "near: student = teacher + 1e-3 noise)",
      20, groups, cases, seed, json);
}

}  // namespace dflash::harness
