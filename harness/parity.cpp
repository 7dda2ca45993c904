#include "harness/parity.h"

#include "fixtures/fixtures.h"
#include "reference/step.h"

namespace dflash::harness {

StepCase make_case(const Config& c, uint64_t step) {
  StepCase s;
  s.config = c;
  s.config.run.dtype = DType::kFloat64;
  s.target = fixtures::make_target(s.config);
  s.drafter = fixtures::make_drafter(s.config);
  s.inputs = fixtures::make_step_inputs(s.config, s.target, step);
  return s;
}

StepCase as_dtype(const StepCase& c64, DType dtype) {
  StepCase s = c64;
  s.config.run.dtype = dtype;
  const at::ScalarType dt = scalar_type(dtype);
  visit(s.target, [&](const std::string&, at::Tensor& t) { t = t.to(dt); });
  if (c64.target.lm_head.is_same(c64.target.embed_tokens)) s.target.lm_head = s.target.embed_tokens;
  s.drafter = clone(c64.drafter);
  visit(s.drafter, [&](const std::string&, at::Tensor& t) {
    t = t.detach().to(master_type(dtype)).clone().requires_grad_(true);
  });
  s.inputs.features = c64.inputs.features.to(dt);
  s.inputs.target_hidden = c64.inputs.target_hidden.to(dt);
  return s;
}

StepResult run_case(const StepFn& fn, const StepCase& c) {
  return run_step(fn, c.config, c.drafter, c.target.frozen(), c.inputs);
}

ComparisonReport compare_steps(const StepResult& o, const StepResult& same, const StepResult& r64,
                               const Tolerance& tol) {
  ComparisonReport rep;
  auto add = [&](const std::string& name, const at::Tensor& a, const at::Tensor& b,
                 const at::Tensor& c, const Tolerance& t) {
    rep.rows.push_back(compare(name, a, b, c, t));
  };
  add("loss", o.out.loss, same.out.loss, r64.out.loss, tol);
  add("ce", o.out.ce, same.out.ce, r64.out.ce, tol);
  add("kl", o.out.kl, same.out.kl, r64.out.kl, tol);
  add("student_hidden", o.out.student_hidden, same.out.student_hidden, r64.out.student_hidden, tol);
  // Metrics count argmax hits; a near-tie may flip in low precision exactly
  // as it may for the same-precision reference, so they get the same rule.
  add("accuracy", o.out.accuracy(), same.out.accuracy(), r64.out.accuracy(), tol);
  add("tau", at::scalar_tensor(o.out.tau(), at::kDouble), at::scalar_tensor(same.out.tau(), at::kDouble),
      at::scalar_tensor(r64.out.tau(), at::kDouble), tol);
  add("weight_sum", o.out.weight_sum, same.out.weight_sum, r64.out.weight_sum, tol);
  for (size_t i = 0; i < r64.grads.size(); ++i)
    add("grad." + r64.grads[i].first, o.grads[i].second, same.grads[i].second, r64.grads[i].second,
        tol);
  return rep;
}

ComparisonReport step_parity(const StepFn& candidate, const Config& config, uint64_t step,
                             const Tolerance& tol) {
  const StepCase c64 = make_case(config, step);
  const StepResult r64 = run_case(reference::drafter_step, c64);
  if (config.run.dtype == DType::kFloat64) {
    const StepCase again = as_dtype(c64, DType::kFloat64);
    return compare_steps(run_case(candidate, again), r64, r64, tol);
  }
  const StepCase low = as_dtype(c64, config.run.dtype);
  const StepResult same = run_case(reference::drafter_step, low);
  const StepCase low2 = as_dtype(c64, config.run.dtype);
  return compare_steps(run_case(candidate, low2), same, r64, tol);
}

}  // namespace dflash::harness
