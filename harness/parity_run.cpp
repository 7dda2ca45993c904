#include "harness/parity_run.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/device.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "core/text.h"
#include "fixtures/fixtures.h"
#include "harness/audit.h"
#include "harness/error_ratios.h"
#include "harness/leakage.h"
#include "harness/memory_guard.h"
#include "harness/on_device.h"
#include "harness/oracle_property.h"
#include "harness/parity.h"
#include "harness/properties.h"
#include "harness/step_dump.h"
#include "harness/zoo.h"
#include "optimized/checkpoint.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

struct CheckRow {
  std::string name;
  bool passed;
  std::string figure;  // cases run, peak vs ceiling, findings...
  double seconds;
  std::string detail;
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void progress(const std::string& what) {
  fmt::print(stderr, "[parity] {} ...\n", what);
  std::fflush(stderr);
}

CheckRow property_row(const PropertyOutcome& o, const ParityOptions& opt) {
  CheckRow r{o.name, o.passed, fmt::format("{} cases, seed {}", o.cases_passed, o.seed), o.seconds,
             ""};
  if (o.passed) return r;
  r.figure =
      fmt::format("FAILED after {} passing cases (seed {}): {}", o.cases_passed, o.seed, o.size);
  r.detail = o.report + save_counterexample(o, opt.out_dir, opt.mutant);
  return r;
}

CheckRow audit_row(const std::string& name, const StepFn& fn, const Config& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const AuditReport rep = audit_step(fn, c, w, target, in);
  return {name, rep.ok(),
          fmt::format("{} tensors, {} findings, {} checkpointed regions", rep.rows.size(),
                      rep.findings.size(), rep.checkpoint_regions),
          since(t0), rep.ok() ? "" : rep.format()};
}

CheckRow leakage_row(const std::string& name, const HiddenFn& hidden, const Config& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const LeakageReport rep = audit_leakage_fixture(hidden, c);
  return {name, rep.ok(), rep.ok() ? rep.format() : "LEAK", since(t0), rep.ok() ? "" : rep.finding};
}

CheckRow memory_row(const std::string& name, const MemoryVerdict& v, double seconds) {
  return {name, v.ok,
          fmt::format("peak {:.2f} MiB <= ceiling {:.2f} MiB", v.measured / 1048576.0,
                      v.ceiling / 1048576.0),
          seconds, v.ok ? "" : v.text};
}

void write_reports(const ParityOptions& o, const std::vector<CheckRow>& rows,
                   const std::vector<KillRow>& kills) {
  if (!o.json.empty()) {
    nlohmann::json j = {{"cases", o.cases},
                        {"seed", o.seed},
                        {"checks", nlohmann::json::array()},
                        {"zoo", nlohmann::json::array()}};
    for (const auto& r : rows)
      j["checks"].push_back({{"name", r.name},
                             {"passed", r.passed},
                             {"figure", r.figure},
                             {"seconds", r.seconds},
                             {"detail", r.detail}});
    for (const auto& k : kills)
      j["zoo"].push_back({{"mutant", k.mutant.name},
                          {"failure_mode", k.mutant.failure_mode},
                          {"meant_for", k.mutant.meant_for},
                          {"killed", k.killed},
                          {"caught_by", k.caught_by},
                          {"counterexample", k.size},
                          {"seconds", k.seconds}});
    safetensors::write_file_atomic(o.json, j.dump(2) + "\n");
  }
  if (!o.junit.empty()) {
    int failures = 0;
    for (const auto& r : rows) failures += !r.passed;
    std::string x = fmt::format(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"dflash-parity\" "
        "tests=\"{}\" failures=\"{}\">\n",
        rows.size(), failures);
    for (const auto& r : rows) {
      x += fmt::format("  <testcase name=\"{}\" time=\"{:.3f}\">", xml_escape(r.name), r.seconds);
      if (!r.passed)
        x += fmt::format("<failure message=\"{}\">{}</failure>", xml_escape(r.figure),
                         xml_escape(r.detail));
      x += "</testcase>\n";
    }
    x += "</testsuite>\n";
    safetensors::write_file_atomic(o.junit, x);
  }
}

c10::Device candidate_device(const ParityOptions& o) {
  return parse_device(o.device, "dflash parity --device");
}

StepFn candidate(const ParityOptions& o) {
  return on_device(o.mutant.empty() ? StepFn(optimized::drafter_step) : mutant_step(o.mutant),
                   candidate_device(o));
}

// The components the properties check: the real ones, or a mutant's, on the
// candidate's device (the checkpoint component's property region is host
// code: it stays on the CPU).
ComponentImpls candidate_components(const ParityOptions& o) {
  const optimized::Components parts =
      o.mutant.empty() ? optimized::real_components() : mutant_components(o.mutant);
  const c10::Device d = candidate_device(o);
  return {on_device(parts.loss, d), on_device(parts.attention, d), parts.checkpoint};
}

int reproduce(const ParityOptions& o) {
  const std::string text = read_whole_file(o.reproduce, "the counterexample");
  const std::string against = o.mutant.empty() ? "the optimized build" : "mutant " + o.mutant;
  const std::string component = case_component(text);
  if (!component.empty()) {
    std::string size;
    const std::string report =
        replay_component_case(text, o.reproduce, candidate_components(o), &size);
    fmt::print("replaying {} ({} case: {}) against {}\n{}{}\n", o.reproduce, component, size,
               against, report.empty() ? "" : report + "\n",
               report.empty() ? "parity: ok" : "parity: FAILED");
    return report.empty() ? 0 : 1;
  }
  const Config c = load_config(o.reproduce);
  guard_memory(c, Workload::kReferenceStep, "dflash parity --reproduce");
  if (text.rfind(kOracleCaseMarker, 0) == 0) {
    fmt::print("replaying {} ({}) against the SPEC oracle\n", o.reproduce, config_size(c));
    const std::string bad = oracle_differences(c, reference::drafter_step);
    fmt::print("{}{}\n", bad, bad.empty() ? "parity: ok" : "parity: FAILED");
    return bad.empty() ? 0 : 1;
  }
  fmt::print("replaying {} ({}) against {}\n", o.reproduce, config_size(c), against);
  const ComparisonReport rep = step_parity(candidate(o), c);
  fmt::print("{}{}\n", rep.format(), rep.ok() ? "parity: ok" : "parity: FAILED");
  return rep.ok() ? 0 : 1;
}

// The four parity properties against `o`'s candidate (real or mutant).
void property_rows(const ParityOptions& o, const PropertyRun& run, std::vector<CheckRow>* rows) {
  const ComponentImpls impls = candidate_components(o);
  progress("parity.step");
  rows->push_back(property_row(check_step_parity(candidate(o), run), o));
  progress("parity.loss");
  rows->push_back(property_row(check_loss_parity(impls.loss, run), o));
  progress("parity.attention");
  rows->push_back(property_row(check_attention_parity(impls.attention, run), o));
  progress("parity.checkpoint");
  rows->push_back(property_row(check_checkpoint_parity(impls.checkpoint, run), o));
  // The reference (code both builds share) against SPEC written as loops:
  // fewer cases, each runs central differences of the oracle's own loss.
  progress("parity.spec_oracle");
  rows->push_back(property_row(
      check_spec_oracle({std::max(1, run.cases / 4), run.seed}, reference::drafter_step), o));
}

// The table, the failure details, the JSON / JUnit reports; exit 1 on any
// failed row.
int finish(const ParityOptions& o, const std::vector<CheckRow>& rows,
           const std::vector<KillRow>& kills) {
  int failed = 0;
  fmt::print("\n{:<44} {:<6} {:>8}  {}\n", "check", "result", "seconds", "key figure");
  for (const auto& r : rows) {
    failed += !r.passed;
    fmt::print("{:<44} {:<6} {:>8.2f}  {}\n", r.name, r.passed ? "pass" : "FAIL", r.seconds,
               r.figure);
  }
  if (!kills.empty())
    fmt::print("\nkill table (each SPEC.md failure mode as a mutant):\n{}", kill_table(kills));
  for (const auto& r : rows)
    if (!r.passed && !r.detail.empty()) fmt::print("\n--- {} ---\n{}\n", r.name, r.detail);
  try {
    write_reports(o, rows, kills);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dflash parity: could not write the reports: {}\n", e.what());
    failed += 1;
  }
  fmt::print("\nparity: {} ({} of {} checks passed{})\n", failed ? "FAILED" : "ok",
             rows.size() - std::min(rows.size(), size_t(failed)), rows.size(),
             o.mutant.empty() ? "" : ", candidate: mutant " + o.mutant);
  return failed ? 1 : 0;
}

}  // namespace

int run_parity(const ParityOptions& o) {
  activate_device(candidate_device(o), "dflash parity --device");
  if (!o.reproduce.empty()) return reproduce(o);
  if (o.measure_tolerances) {
    std::string json;
    fmt::print("{}", o.per_objective ? measure_objective_error_ratios(o.cases, o.seed, &json)
                                     : measure_error_ratios(o.cases, o.seed, &json));
    if (!o.json.empty()) safetensors::write_file_atomic(o.json, json + "\n");
    return 0;
  }
  // A user config is checked (values, then memory) before minutes of properties.
  std::optional<Config> user;
  if (!o.config.empty()) {
    user = load_config(o.config, o.set);
    guard_memory(*user, Workload::kReferenceStep, "dflash parity --config");
  }
  const PropertyRun run{o.cases, o.seed};
  std::vector<CheckRow> rows;
  property_rows(o, run, &rows);
  if (!o.mutant.empty()) return finish(o, rows, {});
  const AttentionFn sparse = candidate_components(o).attention;

  Config audit_cfg = fixtures::micro_config();
  audit_cfg.optimized.checkpoint_layers = true;
  progress("audit");
  rows.push_back(audit_row("audit.reference", reference::drafter_step, audit_cfg));
  rows.push_back(audit_row("audit.optimized", optimized::drafter_step, audit_cfg));
  if (user) {
    rows.push_back(audit_row("audit.reference[" + o.config + "]", reference::drafter_step, *user));
    rows.push_back(audit_row("audit.optimized[" + o.config + "]", optimized::drafter_step, *user));
  }
  progress("leakage");
  const optimized::Components parts = optimized::real_components();
  rows.push_back(leakage_row("leakage.reference", reference_hidden(), audit_cfg));
  rows.push_back(leakage_row("leakage.optimized", optimized_hidden(parts), audit_cfg));
  if (user) {
    rows.push_back(leakage_row("leakage.reference[" + o.config + "]", reference_hidden(), *user));
    rows.push_back(
        leakage_row("leakage.optimized[" + o.config + "]", optimized_hidden(parts), *user));
  }
  progress("memory ceilings");
  auto t0 = std::chrono::steady_clock::now();
  const MemoryVerdict loss_mem = loss_memory_check(optimized::loss_and_metrics);
  rows.push_back(memory_row("memory.chunked_loss", loss_mem, since(t0)));
  t0 = std::chrono::steady_clock::now();
  const MemoryVerdict att_mem = attention_memory_check(sparse);
  rows.push_back(memory_row("memory.sparse_attention", att_mem, since(t0)));

  std::vector<KillRow> kills;
  if (o.zoo) {
    for (const Mutant& m : zoo()) {
      progress("zoo." + m.name);
      kills.push_back(run_mutant(m, run));
      const KillRow& k = kills.back();
      const bool right = k.killed && k.caught_by == m.meant_for;
      rows.push_back({"zoo." + m.name, right,
                      right ? "killed by " + k.caught_by : "SURVIVED its " + m.meant_for + " check",
                      k.seconds, right ? "" : k.detail});
    }
  }

  return finish(o, rows, kills);
}

int run_audit(const Config& c, const std::string& build) {
  const std::string& path = c.path;
  fixtures::require_fixture_sources(c, "dflash audit");
  guard_memory(c, build == "optimized" ? Workload::kStep : Workload::kReferenceStep,
               "dflash audit");
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const StepFn fn =
      build == "optimized" ? StepFn(optimized::drafter_step) : StepFn(reference::drafter_step);
  const AuditReport rep = audit_step(fn, c, w, target, in);
  fmt::print("audit of one {} step of {}\n{}", build, path, rep.format());
  return rep.ok() ? 0 : 1;
}

int run_audit_dump(const std::string& path) {
  const AuditReport rep = audit_recorded(read_step_dump(path));
  fmt::print("audit of the gradients recorded in {}\n{}", path, rep.format());
  return rep.ok() ? 0 : 1;
}

}  // namespace dflash::harness
