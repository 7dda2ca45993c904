// Step parity: a candidate StepFn (the optimized step, or a bug-zoo mutant)
// against the reference on identical inputs and anchors, with the error-ratio
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

// The case with every float input (features, target hidden, drafter and
// frozen weights) multiplied by (1 + rel * N(0, 1)): a rounding-level
// perturbation used to measure how sensitive the reference itself is.
StepCase perturbed(const StepCase& c64, double rel, uint64_t seed);

// The tolerance of each dtype, with its reason (docs/HARNESS.md). Loss,
// ce and kl are sums of log-probabilities of order one nat, and a small KL is
// the difference of such terms: they also get floor_rel as an absolute floor.
struct DtypeRule {
  Tolerance tol;
  // Metrics (accuracy, tau) count argmax hits. A position whose float64
  // top-2 logit margin is below logit_noise * (1 + max |logit|) may flip in
  // this precision; only such near ties may change the counts.
  double logit_noise;
  double rounding;  // relative size of the input perturbations (~half an ulp)
  const char* why;
};
const DtypeRule& dtype_rule(DType d);
Tolerance loss_tolerance(const Tolerance& t);

// Per-slot counts of near ties (weighted positions whose float64 top-2 logit
// margin is below the dtype's noise): the slack of the metric comparisons.
at::Tensor near_ties(const StepCase& c64, const StepResult& r64, double logit_noise);

// `same_precision`: the reference in the candidate's dtype, on the case and
// on rounding-level perturbations of it; err(same) is the worst of them.
ComparisonReport compare_steps(const StepResult& candidate,
                               const std::vector<StepResult>& same_precision,
                               const StepResult& ref64, const Tolerance& tol,
                               const at::Tensor& ties);

// Runs the float64 reference, the reference in config.run.dtype and the
// candidate in config.run.dtype on make_case(config, step), and compares with
// dtype_rule(config.run.dtype).
ComparisonReport step_parity(const StepFn& candidate, const Config& config, uint64_t step = 0);

}  // namespace dflash::harness
