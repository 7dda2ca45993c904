#include "harness/preflight.h"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/env.h"
#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "harness/audit.h"
#include "harness/env_check.h"
#include "harness/leakage.h"
#include "harness/memory_guard.h"
#include "harness/on_device.h"
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
  void not_run(const std::string& name, const std::string& why = "an earlier check failed") {
    rows_.push_back({name, "not run", why, 0, ""});
  }
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
    if (r.result == "FAIL" && !r.detail.empty())
      fmt::print("\n--- {} ---\n{}\n", r.check, r.detail);
  fmt::print("\npreflight: {}\n", failed ? "FAILED" : "ok");
  if (!o_.json.empty()) {
    nlohmann::json j = {
        {"config", o_.config}, {"passed", failed == 0}, {"checks", nlohmann::json::array()}};
    for (const Row& r : rows_)
      j["checks"].push_back({{"check", r.check},
                             {"result", r.result},
                             {"figure", r.figure},
                             {"seconds", r.seconds},
                             {"detail", r.detail}});
    safetensors::write_file_atomic(o_.json, j.dump(2) + "\n");
  }
  return failed ? 1 : 0;
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
  t.target.path.clear();
  t.target.vocab_size = 64;
  t.target.num_hidden_layers = 4;
  t.target.shape = twin_shape(c.target.shape);
  if (!native_architecture(c.target.architecture)) {
    // A target transformers runs: the twin's only job is features for the
    // drafter (the part preflight checks), from a Qwen3 fixture.
    t.target.architecture = "qwen3";
    t.target.shape.qk_norm = true;
    t.target.shape.rope_scaling = RopeScaling{};
  }
  t.target.init_std = 0.2;
  t.target.norm_init_jitter = 0.1;
  t.drafter.num_hidden_layers = std::min<int64_t>(c.drafter.num_hidden_layers, 2);
  t.drafter.shape = twin_shape(c.drafter.shape);
  t.drafter.target_layer_ids.clear();
  for (int64_t i = 0; i < std::min<int64_t>(c.num_taps(), 2); ++i)
    t.drafter.target_layer_ids.push_back(1 + 2 * i);
  t.drafter.allow_last_layer_tap = true;  // the twin is measured, never served
  t.drafter.init_std = 0.2;
  t.drafter.norm_init_jitter = 0.1;
  t.data.source = "fixture";
  t.data.path.clear();
  t.data.eval_path.clear();
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
  // The tile keeps its ratio to S, but at least 2 keys and at most a third of
  // the twin's context, so tiles stay multi-column and ragged as at scale.
  t.optimized.attention_tile = std::clamp<int64_t>(
      round_scaled(c.optimized.attention_tile, double(t.data.seq_len) / double(c.data.seq_len)), 2,
      t.data.seq_len / 3);
  t.topology = TopologyConfig{};
  validate_config(t);
  return t;
}

namespace {

// What the checks after the config share.
struct Subject {
  Config config, twin;
  StepFn step = optimized::drafter_step;
  optimized::Components parts = optimized::real_components();
};

// The run as planned, every rank on the configured devices; the figure is
// the worst rank's estimate, the line `dflash plan` prints for it.
void plan_check(Row& r, const Subject& s) {
  const Plan p = plan_memory(s.config, configured_variant(s.config));
  const std::vector<Estimate> es =
      estimate_memory(s.config, Workload::kPlannedRun, configured_where(s.config));
  size_t worst = 0;
  for (size_t i = 0; i < p.ranks.size(); ++i)
    if (p.ranks[i].headroom < p.ranks[worst].headroom) worst = i;
  r.figure = fmt::format("{}: headroom {}: {}", p.fits() ? "fits" : "OOM",
                         human_bytes(p.ranks[worst].headroom, /*sign=*/true), es[worst].line());
  if (!p.fits()) r.result = "FAIL", r.detail = p.format(true);
}

void environment_check(Row& r, const Subject& s, const PreflightOptions& o) {
  if (o.plan_for_another_machine) {
    r.result = "skip";
    r.figure = "SKIPPED (--plan-for-another-machine): this machine was not checked";
    return;
  }
  const Environment env = o.env_file.empty() ? probe_environment() : load_environment(o.env_file);
  const EnvVerdict v = check_environment(s.config, env, local_world_size_from_process());
  r.figure = v.ok ? v.figure : "FAILED: " + v.figure;
  if (!v.ok) r.result = "FAIL", r.detail = v.detail;
}

// The twin under fresh seeds: new batches, anchors and weights each case
// (the seed selects them, so the case's config alone replays it).
// The twin's candidate runs where the config will (its topology.device),
// unless the run is planned for another machine.
c10::Device twin_device(const Subject& s, const PreflightOptions& o) {
  if (o.plan_for_another_machine || !o.env_file.empty()) return c10::Device(c10::kCPU);
  return config_device(s.config);
}

void twin_parity_check(Row& r, const Subject& s, const PreflightOptions& o) {
  const c10::Device device = twin_device(s, o);
  activate_device(device, s.config.path + ": topology.device");
  const StepFn candidate = on_device(s.step, device);
  const PropertyOutcome out = run_property_public(
      "twin parity", {o.cases, o.seed}, [&](std::string* size, std::string* replay) {
        Config t = s.twin;
        t.run.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
        *size = config_size(t);
        *replay = config_to_toml(t);
        const ComparisonReport rep = step_parity(candidate, t);
        return rep.ok() ? std::string() : rep.format(*replay);
      });
  r.figure = fmt::format("{} cases of {}{}", out.cases_passed, config_size(s.twin),
                         device.is_cpu() ? "" : ", optimized on " + device.str());
  if (out.passed) return;
  r.result = "FAIL";
  r.figure = fmt::format("FAILED after {} passing cases (seed {}): {}", out.cases_passed, o.seed,
                         out.size);
  r.detail = out.report + save_counterexample(out, o.out_dir, o.mutant);
}

void twin_audit_check(Row& r, const Subject& s) {
  const TargetWeights target = make_target(s.twin);
  const DrafterWeights w = make_drafter(s.twin);
  const StepInputs in = fixtures::make_step_inputs(s.twin, target, 0);
  const AuditReport rep = audit_step(s.step, s.twin, w, target, in);
  r.figure = fmt::format("{} tensors, {} findings", rep.rows.size(), rep.findings.size());
  if (!rep.ok()) r.result = "FAIL", r.detail = rep.format();
}

// The information-flow audit on the twin, with the build preflight checks
// (its components: a mutant under test shows here too).
void twin_leakage_check(Row& r, const Subject& s) {
  const LeakageReport rep = audit_leakage_fixture(optimized_hidden(s.parts), s.twin);
  r.figure = rep.ok() ? rep.format() : "a block reads what it must not";
  if (!rep.ok()) r.result = "FAIL", r.detail = rep.finding;
}

void memory_check(Row& r, const Subject& s) {
  // The kernels the config runs with (aten for a CUDA config), measured here on CPU.
  const optimized::Kernels k = configured_variant(s.config).kernels;
  const MemoryVerdict loss = loss_memory_check(s.parts.loss, k);
  const MemoryVerdict att = attention_memory_check(s.parts.attention, k);
  r.figure =
      fmt::format("loss {:.2f}/{:.2f} MiB, attention {:.2f}/{:.2f} MiB", loss.measured / 1048576,
                  loss.ceiling / 1048576, att.measured / 1048576, att.ceiling / 1048576);
  if (!loss.ok || !att.ok) r.result = "FAIL", r.detail = loss.text + "\n" + att.text;
}

// This machine as one process running the target and one drafter step on
// the host: the memory guard's estimate of `dflash step --build optimized`
// (Workload::kStep), against what this host has available now.
void real_step_check(Row& r, const Subject& s) {
  Where where = where_it_runs(s.config);
  if (where.device != "cpu")
    where = {"cpu", fmt::format("cpu (preflight's real step runs on the host, not {})",
                                s.config.topology.device)};
  const MemoryBudget b = memory_budget(s.config, Workload::kStep, where, available_host_bytes());
  if (!b.fits) {
    r.result = "skip";
    r.figure = "does not fit here: " + b.text;
    return;
  }
  const TargetWeights target = make_target(s.config);
  const DrafterWeights w = make_drafter(s.config);
  const StepInputs in = fixtures::make_step_inputs(s.config, target, 0);
  const StepResult res = run_step(s.step, s.config, w, target.frozen(), in);
  const double loss = res.out.loss.item<double>();
  r.figure =
      fmt::format("loss {:.6f}, grad norm {:.4e}, tau {:.3f}", loss, res.grad_norm, res.out.tau());
  if (!std::isfinite(loss) || !std::isfinite(res.grad_norm))
    r.result = "FAIL", r.detail = "non-finite loss or gradient norm";
}

}  // namespace

int run_preflight(const PreflightOptions& o) {
  Preflight pf(o);
  Subject s;
  const bool ready = pf.check("config", [&](Row& r) {
    s.config = load_config(o.config, o.set);
    if (!o.device.empty()) {
      s.config.topology.device = o.device;
      validate_config(s.config);
    }
    r.figure = fmt::format(
        "valid: {} drafter layers, Q = {}, {}", s.config.drafter.num_hidden_layers,
        s.config.data.max_anchors * s.config.data.block_size, dtype_name(s.config.run.dtype));
  }) && pf.check("twin and components", [&](Row& r) {
    if (!o.mutant.empty()) s.step = mutant_step(o.mutant), s.parts = mutant_components(o.mutant);
    s.twin = scaled_twin(s.config);
    r.figure = fmt::format("{}{}", config_size(s.twin),
                           o.mutant.empty() ? "" : ", mutant " + o.mutant + " (test hook)");
  });
  if (!ready) {
    for (const char* n : {"environment", "memory plan", "twin parity", "twin audit", "twin leakage",
                          "memory ceilings", "real step"})
      pf.not_run(n);
    return pf.finish();
  }
  const bool env_ok = pf.check("environment", [&](Row& r) { environment_check(r, s, o); });
  pf.check("memory plan", [&](Row& r) { plan_check(r, s); });
  // One cause, one FAIL: a twin meant for a device the environment check
  // found unusable is not run, pointing at that row.
  if (env_ok || twin_device(s, o).is_cpu())
    pf.check("twin parity", [&](Row& r) { twin_parity_check(r, s, o); });
  else
    pf.not_run("twin parity", "runs on topology.device = \"" + s.config.topology.device +
                                  "\", which the environment check found unusable");
  pf.check("twin audit", [&](Row& r) { twin_audit_check(r, s); });
  pf.check("twin leakage", [&](Row& r) { twin_leakage_check(r, s); });
  pf.check("memory ceilings", [&](Row& r) { memory_check(r, s); });
  pf.check("real step", [&](Row& r) { real_step_check(r, s); });
  return pf.finish();
}

}  // namespace dflash::harness
