#include "harness/oracle_property.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "fixtures/fixtures.h"
#include "harness/generators.h"
#include "harness/spec_oracle.h"

namespace dflash::harness {

const char* const kOracleCaseMarker = "# parity.spec_oracle counterexample";

namespace {

template <typename T>
std::vector<T> flat(const at::Tensor& t, at::ScalarType dt) {
  const at::Tensor c = t.detach().to(dt).contiguous();
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

std::vector<uint8_t> flat_bool(const at::Tensor& t) {
  std::vector<uint8_t> out;
  for (int64_t x : flat<int64_t>(t, at::kLong)) out.push_back(uint8_t(x != 0));
  return out;
}

OracleInputs oracle_inputs(const StepInputs& in) {
  OracleInputs o;
  o.B = in.input_ids.size(0);
  o.S = in.input_ids.size(1);
  o.N = in.anchors.num_anchors();
  o.input_ids = flat<int64_t>(in.input_ids, at::kLong);
  o.loss_mask = flat_bool(in.loss_mask);
  o.features = flat<double>(in.features, at::kDouble);
  o.target_hidden = flat<double>(in.target_hidden, at::kDouble);
  o.anchors = flat<int64_t>(in.anchors.anchors, at::kLong);
  o.keep = flat_bool(in.anchors.keep);
  return o;
}

OracleParams oracle_params(const DrafterWeights& w, const FrozenWeights& f) {
  OracleParams p;
  for (const auto& [name, t] : named(w)) p[name] = flat<double>(t, at::kDouble);
  for (const auto& [name, t] : named(f)) p[name] = flat<double>(t, at::kDouble);
  return p;
}

// "" when |a - b| <= tol * max(1, |b|), else a line naming `what`.
std::string close(const std::string& what, double a, double b, double tol) {
  if (std::abs(a - b) <= tol * std::max(1.0, std::abs(b))) return "";
  return fmt::format("{}: reference {:.12g}, oracle {:.12g}\n", what, a, b);
}

// The outputs of one step against the oracle.
std::string compare_outputs(const StepOutputs& ref, const OracleResult& o) {
  // Both compute in float64 with different summation orders: 1e-9.
  std::string bad = close("loss", ref.loss.item<double>(), o.loss, 1e-9) +
                    close("ce", ref.ce.item<double>(), o.ce, 1e-9) +
                    close("kl", ref.kl.item<double>(), o.kl, 1e-9) +
                    close("reverse_kl", ref.reverse_kl.item<double>(), o.reverse_kl, 1e-9) +
                    close("jsd", ref.jsd.item<double>(), o.jsd, 1e-9) +
                    close("tv", ref.tv.item<double>(), o.tv, 1e-9) +
                    close("weight_sum", ref.weight_sum.item<double>(), o.weight_sum, 1e-12) +
                    close("tau", ref.tau(), o.tau, 0);
  if (flat<int64_t>(ref.correct, at::kLong) != o.correct) bad += "per-slot correct differs\n";
  if (flat<int64_t>(ref.counted, at::kLong) != o.counted) bad += "per-slot counted differs\n";
  const std::vector<double> D = flat<double>(ref.student_hidden, at::kDouble);
  for (size_t i = 0; i < D.size(); ++i) {
    const std::string e =
        close(fmt::format("student_hidden[{}]", i), D[i], o.student_hidden[i], 1e-9);
    if (!e.empty()) return bad + e;
  }
  if (!o.anchor_violation.empty()) bad += "anchors: " + o.anchor_violation + "\n";
  return bad;
}

// Each gradient at its largest entry and two drawn ones, against central
// differences of the oracle: within 1e-6 of the gradient's scale, plus
// 1e-8 of the loss (what a central difference resolves: rounding eps * |L|
// / h and the h^2 term; measured up to 6e-9 on a gradient of scale 1e-3 at
// temperature 0.5, seed 90210 of `dflash parity --cases 1000`).
std::string compare_gradients(const Config& c, const StepResult& r, const OracleInputs& in,
                              const OracleParams& p) {
  std::string bad;
  const double fd_floor = 1e-8 * std::max(1.0, std::abs(r.out.loss.item<double>()));
  for (const auto& [name, g] : r.grads) {
    if (!g.defined()) {
      bad += name + ": the reference gives no gradient\n";
      continue;
    }
    const std::vector<double> ref = flat<double>(g, at::kDouble);
    double scale = 1e-3;
    size_t top = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      if (std::abs(ref[i]) > std::abs(ref[top])) top = i;
    scale = std::max(scale, std::abs(ref[top]));
    // Two drawn entries beside the largest: seeded by the config and the
    // name, so a replay (`dflash parity --reproduce`) checks the same ones.
    Rng pick(derive_seed(c.run.seed, "oracle:" + name));
    for (size_t i : {top, size_t(pick.below(ref.size())), size_t(pick.below(ref.size()))}) {
      const double o = oracle_gradient(c, in, p, name, i);
      if (std::abs(ref[i] - o) <= 1e-6 * scale + fd_floor) continue;
      // A step of 1e-5 can straddle TV's kink (|p_s - p_t| = 0 within the
      // step) and average its two sides; 100x smaller, the difference is
      // still exact to ~1e-9 of the scale and crosses no kink the
      // reference's point does not sit on.
      const double fine = oracle_gradient(c, in, p, name, i, 1e-7);
      if (std::abs(ref[i] - fine) <= 1e-6 * scale + fd_floor) continue;
      bad += fmt::format(
          "grad {}[{}]: reference {:.10g}, oracle {:.10g} (step 1e-7: {:.10g}; scale {:.3g})\n",
          name, i, ref[i], o, fine, scale);
    }
  }
  return bad;
}

}  // namespace

std::string oracle_differences(const Config& cfg, const StepFn& shared) {
  Config c = cfg;
  c.run.dtype = DType::kFloat64;
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const StepResult r = run_step(shared, c, w, target.frozen(), in);
  const OracleInputs oi = oracle_inputs(in);
  const OracleParams op = oracle_params(w, target.frozen());
  return compare_outputs(r.out, oracle_step(c, oi, op)) + compare_gradients(c, r, oi, op);
}

PropertyOutcome check_spec_oracle(const PropertyRun& run, const StepFn& shared,
                                  const std::string& name) {
  return run_property_public(name, run, [&](std::string* size, std::string* replay) {
    Config c = *gen_step_config();
    c.run.dtype = DType::kFloat64;
    *size = config_size(c) + " against the SPEC oracle";
    *replay = std::string(kOracleCaseMarker) + "\n" + config_to_toml(c);
    const std::string bad = oracle_differences(c, shared);
    return bad.empty() ? bad : bad + "config:\n" + config_to_toml(c);
  });
}

}  // namespace dflash::harness
