#include "harness/properties.h"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <chrono>
#include <cstdlib>

#include "harness/generators.h"
#include "harness/parity.h"
#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

// Runs `body` as a RapidCheck property. `body` returns "" on success or the
// failure report; the report of the last failing run (after shrinking: the
// minimal case) is kept, with its shown counterexample and size.
PropertyOutcome run_property(const std::string& name, const PropertyRun& run,
                             const std::function<std::string(std::string* size)>& body) {
  PropertyOutcome out;
  out.name = name;
  out.seed = run.seed;
  std::string last_report, last_size;
  const auto t0 = std::chrono::steady_clock::now();
  rc::detail::TestParams params;
  params.seed = run.seed;
  params.maxSuccess = run.cases;
  params.maxSize = 100;
  rc::detail::TestMetadata meta;
  meta.id = meta.description = name;
  const rc::detail::TestResult result =
      rc::detail::checkProperty(rc::detail::toProperty([&] {
                                  std::string size;
                                  const std::string report = body(&size);
                                  if (!report.empty()) last_report = report, last_size = size;
                                  RC_ASSERT(report.empty());
                                }),
                                meta, params);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result.is<rc::detail::SuccessResult>()) {
    out.passed = true;
    out.cases_passed = result.get<rc::detail::SuccessResult>().numSuccess;
  } else if (result.is<rc::detail::FailureResult>()) {
    const auto& bad = result.get<rc::detail::FailureResult>();
    out.cases_passed = bad.numSuccess;
    for (const auto& [type, value] : bad.counterExample) out.counterexample += value;
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
                                    const std::function<std::string(std::string* size)>& body) {
  return run_property(name, run, body);
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
  return run_property(name, run, [&](std::string* size) {
    const Config c = *gen_step_config();
    *size = config_size(c);
    return failure(step_parity(candidate, c), config_to_toml(c));
  });
}

PropertyRun run_from_env(int default_cases, uint64_t default_seed) {
  PropertyRun r{default_cases, default_seed};
  if (const char* n = std::getenv("DFLASH_CASES")) r.cases = std::max(1, std::atoi(n));
  if (const char* s = std::getenv("DFLASH_SEED")) r.seed = std::strtoull(s, nullptr, 10);
  return r;
}

}  // namespace dflash::harness
