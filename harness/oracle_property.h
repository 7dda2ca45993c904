// The SPEC oracle (harness/spec_oracle.h) as a property: the reference step
// on generated tiny float64 configs against the oracle, every output, the
// anchors' contract and each gradient at its largest entry and two drawn
// ones. It catches what parity cannot: a mistake in code both builds share
// (the draft layout, the decay table, norms, RoPE, the loss) makes them
// agree with each other and disagree with SPEC. Run by `dflash parity`
// (row parity.spec_oracle) and by harness_spec_oracle_test.
#pragma once

#include <string>

#include "core/step.h"
#include "harness/properties.h"

namespace dflash::harness {

// The first line of an oracle counterexample: `dflash parity --reproduce`
// replays a config that starts with it against the oracle.
extern const char* const kOracleCaseMarker;

// "" when `shared` (the reference step, or a candidate) agrees with the
// oracle on `c` (float64), else the differences, one per line.
std::string oracle_differences(const Config& c, const StepFn& shared);

PropertyOutcome check_spec_oracle(const PropertyRun& run, const StepFn& shared,
                                  const std::string& name = "parity.spec_oracle");

}  // namespace dflash::harness
