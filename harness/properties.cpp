#include "harness/properties.h"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "core/safetensors.h"
#include "harness/generators.h"
#include "harness/parity.h"
#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

// RapidCheck's default listener prints "Falsifiable after ..." and, at exit,
// a reproduce line for every failed property in the process (the zoo's
// intended failures too); dflash reports failures itself.
struct SilentListener : rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

// RapidCheck loads its process-wide configuration (RC_PARAMS) on first use
// and prints "Using configuration: seed=..." to stderr. dflash states its
// own seed in every report, so the first load happens here, silenced.
void load_rapidcheck_configuration_quietly() {
  static const bool loaded = [] {
    std::streambuf* err = std::cerr.rdbuf(nullptr);
    try {
      rc::detail::configuration();
    } catch (...) {
      std::cerr.rdbuf(err);
      throw;
    }
    std::cerr.rdbuf(err);
    return true;
  }();
  (void)loaded;
}

// Runs `body` as a RapidCheck property. `body` returns "" on success or the
// failure report; the report, replay text and size of the last failing run
// (after shrinking: the minimal case) are kept. An exception thrown by a
// case is that case's failure.
PropertyOutcome run_property(const std::string& name, const PropertyRun& run,
                             const PropertyBody& body) {
  load_rapidcheck_configuration_quietly();
  PropertyOutcome out;
  out.name = name;
  out.seed = run.seed;
  std::string last_report, last_size, last_replay;
  const auto t0 = std::chrono::steady_clock::now();
  rc::detail::TestParams params;
  params.seed = run.seed;
  params.maxSuccess = run.cases;
  params.maxSize = 100;
  rc::detail::TestMetadata meta;
  meta.id = meta.description = name;
  SilentListener quiet;
  const rc::detail::TestResult result = rc::detail::checkProperty(
      rc::detail::toProperty([&] {
        std::string size, replay, report;
        try {
          report = body(&size, &replay);
        } catch (const std::exception& e) {
          report = fmt::format("{}: the case threw: {}", size.empty() ? name : size, e.what());
        }
        if (!report.empty()) last_report = report, last_size = size, last_replay = replay;
        RC_ASSERT(report.empty());
      }),
      meta, params, quiet);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result.is<rc::detail::SuccessResult>()) {
    out.passed = true;
    out.cases_passed = result.get<rc::detail::SuccessResult>().numSuccess;
  } else if (result.is<rc::detail::FailureResult>()) {
    const auto& bad = result.get<rc::detail::FailureResult>();
    out.cases_passed = bad.numSuccess;
    out.counterexample = last_replay;
    out.report = last_report.empty() ? bad.description : last_report;
    out.size = last_size;
  } else {
    out.report = "RapidCheck gave up or failed to run the property";
  }
  return out;
}

std::string failure(const ComparisonReport& rep, const std::string& context) {
  return rep.ok() ? "" : rep.format(context);
}

}  // namespace

PropertyOutcome run_property_public(const std::string& name, const PropertyRun& run,
                                    const PropertyBody& body) {
  return run_property(name, run, body);
}

std::string save_counterexample(const PropertyOutcome& o, const std::string& out_dir,
                                const std::string& mutant) {
  if (o.counterexample.empty()) return "";
  std::string name = o.name;
  for (char& ch : name)
    if (ch == ' ' || ch == '/') ch = '-';
  const std::string path = fmt::format("{}/counterexample-{}.toml", out_dir, name);
  try {
    std::filesystem::create_directories(out_dir);
    safetensors::write_file_atomic(path, o.counterexample);
  } catch (const std::exception& e) {
    return fmt::format("\ncould not write the counterexample to {} ({}); it reads:\n{}", path,
                       e.what(), o.counterexample);
  }
  return fmt::format(
      "\nminimal counterexample written to {}\nreplay: dflash parity --reproduce {}{}\n", path,
      path, mutant.empty() ? "" : " --mutant " + mutant);
}

std::string config_size(const Config& c) {
  const int64_t Q = c.data.max_anchors * c.data.block_size;
  return fmt::format(
      "B={} S={} Q<={} bs={} H={} V={} layers={} chunk={} {}{}{}{}", c.data.batch_size,
      c.data.seq_len, Q, c.data.block_size, c.drafter.shape.hidden_size, c.target.vocab_size,
      c.drafter.num_hidden_layers, c.loss.chunk_size, dtype_name(c.run.dtype),
      c.optimized.chunked_loss ? " chunked" : "", c.optimized.sparse_attention ? " sparse" : "",
      c.optimized.checkpoint_layers ? " checkpointed" : "");
}

PropertyOutcome check_step_parity(const StepFn& candidate, const PropertyRun& run,
                                  const std::string& name) {
  return run_property(name, run, [&](std::string* size, std::string* replay) {
    const Config c = *gen_step_config();
    *size = config_size(c);
    *replay = config_to_toml(c);
    return failure(step_parity(candidate, c), *replay);
  });
}

PropertyRun run_from_env(int default_cases, uint64_t default_seed) {
  PropertyRun r{default_cases, default_seed};
  if (const char* n = std::getenv("DFLASH_CASES")) r.cases = std::max(1, std::atoi(n));
  if (const char* s = std::getenv("DFLASH_SEED")) r.seed = std::strtoull(s, nullptr, 10);
  return r;
}

}  // namespace dflash::harness
