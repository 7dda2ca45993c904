// Step parity: a candidate StepFn (the optimized step, or any build) against
// the reference on identical inputs and anchors, with the error-ratio
// tolerance of harness/tolerance.h on the loss, every metric and every
// trainable gradient.
#pragma once

#include <string>

#include "core/step.h"
#include "harness/tolerance.h"

namespace dflash::harness {

// One step's inputs, built once in float64 from the fixtures and cast down,
// so every precision sees the same values (anchors included).
struct StepCase {
  Config config;
  TargetWeights target;
  DrafterWeights drafter;  // trainable leaves
  StepInputs inputs;
};

StepCase make_case(const Config& c, uint64_t step);
// The same case in another dtype: inputs and frozen weights cast, fresh
// master leaves in master_type(dtype).
StepCase as_dtype(const StepCase& c64, DType dtype);

StepResult run_case(const StepFn& fn, const StepCase& c);

ComparisonReport compare_steps(const StepResult& candidate, const StepResult& same_precision,
                               const StepResult& ref64, const Tolerance& tol);

// Runs the float64 reference, the reference in config.run.dtype and the
// candidate in config.run.dtype on make_case(config, step), and compares.
ComparisonReport step_parity(const StepFn& candidate, const Config& config, uint64_t step,
                             const Tolerance& tol);

}  // namespace dflash::harness
