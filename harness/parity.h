// Step parity: a candidate StepFn (the optimized step, or a bug-zoo mutant)
// against the reference on identical inputs and anchors, with the error-ratio
// tolerance of harness/tolerance.h on the loss, every metric and every
// trainable gradient.
#pragma once

#include <map>
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

// Total variation's gradient holds sign(p_s - p_t) (docs/LOSSES.md): where
// the two probabilities agree to within what the run's dtype resolves, the
// sign is a coin toss in that dtype, and a flip moves the gradient by a
// finite step that no rounding-level perturbation of the reference need
// reproduce. The slack is that step, exactly, from the float64 reference:
// for each such entry (row r, token v) of a weighted row, tv_weight * w_r /
// sum(w) * |d p_s[r, v] / d theta| per trainable parameter, summed over the
// entries. An entry counts when the candidate's own student hidden state
// (held to its tolerance by the student_hidden row) puts p_s on the other
// side of p_t, or when |log p_s - log p_t| is under twice the dtype's
// rounding of the logits. Empty for float64, without TV, or without such
// entries. Keys: "grad.<name>", the candidate gradient's shape.
std::map<std::string, at::Tensor> tv_sign_slack(const StepCase& c64, const StepResult& candidate,
                                                const DtypeRule& rule);

// The loss terms' share of the candidate's student hidden state error: each
// of loss, ce, kl, reverse_kl, jsd and tv of the float64 reference evaluated
// at the candidate's own D (cast to float64) minus the same at the
// reference's D, as an absolute slack (a 0-dim tensor per name). D is held
// to its own tolerance by the student_hidden row; what its error does to a
// loss term through the softmax (doubled at temperature 0.5, a few nats of
// logits) is then not charged a second time to the loss computation, whose
// own rounding the rule judges. Empty for float64.
std::map<std::string, at::Tensor> hidden_state_slack(const StepCase& c64,
                                                     const StepResult& candidate,
                                                     const StepResult& ref64);

// The loss terms every comparison of a loss holds (compare_outputs): loss,
// ce, kl, reverse_kl, jsd, tv.
NamedOutputs loss_terms(const StepOutputs& o);

// `same_precision`: the reference in the candidate's dtype, on the case and
// on rounding-level perturbations of it; err(same) is the worst of them.
// `slack`: tv_sign_slack's allowance per gradient (none where absent).
ComparisonReport compare_steps(const StepResult& candidate,
                               const std::vector<StepResult>& same_precision,
                               const StepResult& ref64, const Tolerance& tol,
                               const at::Tensor& ties,
                               const std::map<std::string, at::Tensor>& slack = {});

// Runs the float64 reference, the reference in config.run.dtype and the
// candidate in config.run.dtype on make_case(config, step), and compares with
// dtype_rule(config.run.dtype).
ComparisonReport step_parity(const StepFn& candidate, const Config& config, uint64_t step = 0);

}  // namespace dflash::harness
