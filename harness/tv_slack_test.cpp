// TV's sign slack (harness/parity.h tv_sign_slack) on the case that raised
// a false alarm (fixtures/configs/regressions/tv-sign-bf16.toml): the real
// optimized step passes, and a candidate whose TV gradient is reversed
// everywhere still fails, so the slack covers the ambiguous entries only.
#include <gtest/gtest.h>

#include "fixtures/test_support.h"
#include "harness/parity.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

Config regression_case() {
  return load_config(testing_support::cfg("regressions/tv-sign-bf16.toml"));
}

// The reference step with the same loss value but TV's gradient reversed.
StepOutputs reversed_tv(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                        const StepInputs& in) {
  StepOutputs a = reference::drafter_step(c, w, f, in);
  Config no_tv = c;
  no_tv.loss.tv_weight = 0;
  const StepOutputs b = reference::drafter_step(no_tv, w, f, in);
  const at::Tensor tv = a.loss - b.loss;  // () the TV term, with its gradient
  a.loss = b.loss - tv + 2 * tv.detach();
  return a;
}

TEST(TvSignSlack, TheFalseAlarmCasePasses) {
  const Config c = regression_case();
  ASSERT_EQ(c.run.dtype, DType::kBFloat16);
  const ComparisonReport rep = step_parity(optimized::drafter_step, c);
  EXPECT_TRUE(rep.ok()) << rep.format();
  // the slack was needed: the case has entries whose sign bf16 cannot resolve
  const StepCase c64 = make_case(c, 0);
  const StepResult cand = run_case(optimized::drafter_step, as_dtype(c64, c.run.dtype));
  const auto slack = tv_sign_slack(c64, cand, dtype_rule(c.run.dtype));
  EXPECT_FALSE(slack.empty());
}

TEST(TvSignSlack, AReversedTvGradientStillFails) {
  for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
    Config c = regression_case();
    c.run.dtype = dt;
    const ComparisonReport rep = step_parity(reversed_tv, c);
    EXPECT_FALSE(rep.ok()) << dtype_name(dt) << "\n" << rep.format();
    for (const Comparison& r : rep.rows)
      if (r.name == "loss") EXPECT_TRUE(r.ok) << "the loss value is unchanged: " << r.describe();
  }
}

TEST(TvSignSlack, NoneInFloat64OrWithoutTv) {
  Config c = regression_case();
  const StepCase c64 = make_case(c, 0);
  const StepResult r64 = run_case(reference::drafter_step, c64);
  EXPECT_TRUE(tv_sign_slack(c64, r64, dtype_rule(DType::kFloat64)).empty());
  c.loss.tv_weight = 0;
  const StepCase no_tv = make_case(c, 0);
  EXPECT_TRUE(tv_sign_slack(no_tv, r64, dtype_rule(DType::kBFloat16)).empty());
}

}  // namespace
}  // namespace dflash::harness
