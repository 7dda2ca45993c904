// The reference against the SPEC oracle (harness/spec_oracle.h), which
// shares no code with it: generated tiny float64 configs (the step
// property's generator: ragged masks, rows without candidates, GQA, taps,
// decay, KL), every output of the step, the anchors' contract, and each
// trainable parameter's gradient at its largest entry and two drawn ones
// (harness/oracle_property.h, also `dflash parity`'s parity.spec_oracle).
// A mistake in code both builds share (layout, norms, RoPE, attention, MLP,
// fc, loss, metrics) fails here although parity passes.
#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "harness/oracle_property.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

TEST(SpecOracle, ReferenceMatchesTheOracleOnGeneratedTinyConfigs) {
  const PropertyOutcome out = check_spec_oracle(run_from_env(100, 11), reference::drafter_step);
  EXPECT_TRUE(out.passed) << out.name << " FAILED after " << out.cases_passed << " cases, "
                          << out.size << "\n"
                          << out.report;
}

// The oracle is not vacuous: a step whose labels are shifted by one (the
// SPEC failure mode "labels shifted by one") disagrees with it.
TEST(SpecOracle, SeesAShiftedLabel) {
  const Config c = fixtures::micro_config();
  EXPECT_EQ(oracle_differences(c, reference::drafter_step), "");
  const StepFn shifted = [](const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                            const StepInputs& in) {
    StepInputs s = in;
    s.input_ids = at::roll(in.input_ids, 1, 1);
    return reference::drafter_step(c, w, f, s);
  };
  EXPECT_NE(oracle_differences(c, shifted), "");
}

}  // namespace
}  // namespace dflash::harness
