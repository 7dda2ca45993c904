#include "harness/preflight.h"

#include <rapidcheck.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "harness/audit.h"
#include "harness/parity.h"
#include "harness/planner.h"
#include "harness/properties.h"
#include "harness/zoo.h"
#include "optimized/step.h"

namespace dflash::harness {
namespace {

struct Row {
  std::string check;
  std::string result;  // "pass", "FAIL", "skip"
  std::string figure;
  double seconds = 0;
  std::string detail;
};

class Preflight {
 public:
  explicit Preflight(const PreflightOptions& o) : o_(o) {}

  template <typename F>
  bool check(const std::string& name, F&& body) {
    fmt::print(stderr, "[preflight] {} ...\n", name);
    std::fflush(stderr);
    const auto t0 = std::chrono::steady_clock::now();
    Row r{name, "pass", "", 0, ""};
    try {
      body(r);
    } catch (const std::exception& e) {
      r.result = "FAIL";
      r.figure = e.what();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rows_.push_back(r);
    return r.result != "FAIL";
  }
  void not_run(const std::string& name) { rows_.push_back({name, "not run", "an earlier check failed", 0, ""}); }
  int finish() const;

 private:
  const PreflightOptions& o_;
  std::vector<Row> rows_;
};

int Preflight::finish() const {
  int failed = 0;
  fmt::print("\n{:<34} {:<8} {:>8}  {}\n", "check", "result", "seconds", "key figure");
  for (const Row& r : rows_) {
    failed += r.result == "FAIL" || r.result == "not run";
    fmt::print("{:<34} {:<8} {:>8.2f}  {}\n", r.check, r.result, r.seconds, r.figure);
  }
  for (const Row& r : rows_)
    if (r.result == "FAIL" && !r.detail.empty()) fmt::print("\n--- {} ---\n{}\n", r.check, r.detail);
  fmt::print("\npreflight: {}\n", failed ? "FAILED" : "ok");
  if (!o_.json.empty()) {
    nlohmann::json j = {{"config", o_.config}, {"passed", failed == 0}, {"checks", nlohmann::json::array()}};
    for (const Row& r : rows_)
      j["checks"].push_back({{"check", r.check}, {"result", r.result}, {"figure", r.figure},
                             {"seconds", r.seconds}, {"detail", r.detail}});
    safetensors::write_file_atomic(o_.json, j.dump(2) + "\n");
  }
  return failed ? 1 : 0;
}

std::string human(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  return fmt::format("{:.2f} MB", bytes / 1e6);
}

int64_t round_scaled(int64_t value, double scale) {
  return std::max<int64_t>(1, int64_t(std::llround(double(value) * scale)));
}

LayerShape twin_shape(const LayerShape& s) {
  const int64_t group = s.num_attention_heads / s.num_key_value_heads;
  LayerShape t = s;
  t.hidden_size = 16;
  t.num_key_value_heads = 1;
  t.num_attention_heads = std::min<int64_t>(group, 4);
  t.head_dim = 8;
  t.intermediate_size = 24;
  return t;
}

}  // namespace

Config scaled_twin(const Config& c) {
  Config t = c;
  t.path = c.path + " (scaled twin)";
  t.target.source = "fixture";
  t.target.vocab_size = 64;
  t.target.num_hidden_layers = 4;
  t.target.shape = twin_shape(c.target.shape);
  t.target.init_std = 0.2;
  t.target.norm_init_jitter = 0.1;
  t.drafter.num_hidden_layers = std::min<int64_t>(c.drafter.num_hidden_layers, 2);
  t.drafter.shape = twin_shape(c.drafter.shape);
  t.drafter.target_layer_ids.clear();
  for (int64_t i = 0; i < std::min<int64_t>(c.num_taps(), 2); ++i) t.drafter.target_layer_ids.push_back(1 + 2 * i);
  t.drafter.init_std = 0.2;
  t.drafter.norm_init_jitter = 0.1;
  t.data.source = "fixture";
  t.data.input_ids.clear();
  t.data.loss_mask.clear();
  // Four rows when the config batches rows, so the fixture's short and empty
  // rows (keep = false padding) are exercised; one row otherwise.
  t.data.batch_size = c.data.batch_size > 1 ? 4 : 1;
  t.data.max_anchors = std::min<int64_t>(c.data.max_anchors, 4);
  t.data.seq_len = 4 * c.data.block_size + 8;
  t.data.mask_token_id = t.target.vocab_size - 1;
  // The chunk keeps its ratio to the draft positions (0 stays whole-Q).
  const double q_ratio = double(t.data.max_anchors) / double(c.data.max_anchors);
  t.loss.chunk_size = c.loss.chunk_size == 0 ? 0 : round_scaled(c.loss.chunk_size, q_ratio);
  t.optimized.attention_tile =
      round_scaled(c.optimized.attention_tile, double(t.data.seq_len) / double(c.data.seq_len));
  t.topology = TopologyConfig{};
  validate_config(t);
  return t;
}

int run_preflight(const PreflightOptions& o) {
  Preflight pf(o);
  Config c;
  if (!pf.check("config", [&](Row& r) {
        c = load_config(o.config);
        r.figure = fmt::format("valid: {} drafter layers, Q = {}, {}", c.drafter.num_hidden_layers,
                               c.data.max_anchors * c.data.block_size, dtype_name(c.run.dtype));
      })) {
    for (const char* n : {"memory plan", "twin parity", "twin audit", "memory ceilings", "real step"})
      pf.not_run(n);
    return pf.finish();
  }
  const StepFn step = o.mutant.empty() ? StepFn(optimized::drafter_step) : mutant_step(o.mutant);
  const optimized::Components parts =
      o.mutant.empty() ? optimized::real_components() : mutant_components(o.mutant);
  pf.check("memory plan", [&](Row& r) {
    const Plan p = plan_memory(c, configured_variant(c));
    double worst = 1e300;
    for (const auto& rk : p.ranks) worst = std::min(worst, rk.headroom);
    double peak = 0;
    for (const auto& rk : p.ranks) peak = std::max(peak, rk.peak);
    r.figure = fmt::format("{}: largest rank peak {}, worst headroom {}", p.fits() ? "fits" : "OOM",
                           human(peak), human(worst));
    if (!p.fits()) r.result = "FAIL", r.detail = p.format(true);
  });
  const Config twin = scaled_twin(c);
  pf.check("twin parity", [&](Row& r) {
    // The twin under fresh seeds (new batches, anchors and weights each case).
    const PropertyOutcome out = run_property_public("twin parity", {o.cases, o.seed}, [&](std::string* size) {
      Config t = twin;
      t.run.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
      *size = config_size(t);
      const ComparisonReport rep = step_parity(step, t, *rc::gen::inRange<uint64_t>(0, 100));
      return rep.ok() ? std::string() : rep.format(config_to_toml(t));
    });
    r.figure = fmt::format("{} cases of {}", out.cases_passed, config_size(twin));
    if (!out.passed) r.result = "FAIL", r.detail = out.report;
  });
  pf.check("twin audit", [&](Row& r) {
    const TargetWeights target = fixtures::make_target(twin);
    const DrafterWeights w = fixtures::make_drafter(twin);
    const StepInputs in = fixtures::make_step_inputs(twin, target, 0);
    const AuditReport rep = audit_step(step, twin, w, target, in);
    r.figure = fmt::format("{} tensors, {} findings", rep.rows.size(), rep.findings.size());
    if (!rep.ok()) r.result = "FAIL", r.detail = rep.format();
  });
  pf.check("memory ceilings", [&](Row& r) {
    const MemoryVerdict loss = loss_memory_check(parts.loss);
    const MemoryVerdict att = attention_memory_check(
        [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Anchors& a,
            int64_t S, int64_t bs, int64_t tile) { return parts.attention(q, k, v, a, S, bs, tile); });
    r.figure = fmt::format("loss {:.2f}/{:.2f} MiB, attention {:.2f}/{:.2f} MiB", loss.measured / 1048576,
                           loss.ceiling / 1048576, att.measured / 1048576, att.ceiling / 1048576);
    if (!loss.ok || !att.ok) r.result = "FAIL", r.detail = loss.text + "\n" + att.text;
  });
  pf.check("real step", [&](Row& r) {
    // This machine as one process running the target and one drafter step.
    Config local = c;
    local.topology = TopologyConfig{};
    const Plan p = plan_memory(local, configured_variant(local));
    const double need = p.ranks[0].peak, have = machine_memory_bytes() * 0.8;
    if (need > have) {
      r.result = "skip";
      r.figure = fmt::format("needs {:.1f} GB here, this machine offers {:.1f} GB", need / 1e9, have / 1e9);
      return;
    }
    const TargetWeights target = fixtures::make_target(c);
    const DrafterWeights w = fixtures::make_drafter(c);
    const StepInputs in = fixtures::make_step_inputs(c, target, 0);
    const StepResult res = run_step(step, c, w, target.frozen(), in);
    const double loss = res.out.loss.item<double>();
    bool finite = std::isfinite(loss) && std::isfinite(res.grad_norm);
    r.figure = fmt::format("loss {:.6f}, grad norm {:.4e}, tau {:.3f}", loss, res.grad_norm, res.out.tau());
    if (!finite) r.result = "FAIL", r.detail = "non-finite loss or gradient norm";
  });
  return pf.finish();
}

}  // namespace dflash::harness
