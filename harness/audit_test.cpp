// The audit's rules on the real steps: the per-parameter table, the
// context-blind exception to rule (c), and a step with no weighted position.
#include "harness/audit.h"

#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

struct Case {
  Config c = fixtures::micro_config();
  TargetWeights target;
  DrafterWeights w;
  StepInputs in;
  Case()
      : target(make_target(c)), w(make_drafter(c)), in(fixtures::make_step_inputs(c, target, 0)) {}
};

TEST(Audit, TableCoversEveryTrainableAndFrozenTensor) {
  Case k;
  const AuditReport rep = audit_step(optimized::drafter_step, k.c, k.w, k.target, k.in);
  EXPECT_TRUE(rep.ok()) << rep.format();
  size_t frozen = 0;
  visit(k.target, [&](const std::string&, at::Tensor&) { ++frozen; });
  EXPECT_EQ(rep.rows.size(), named(k.w).size() + frozen);
  EXPECT_NE(rep.format().find("lm_head.weight"), std::string::npos);
}

TEST(Audit, ContextParametersMayBeZeroWhenNoBlockSeesContext) {
  Case k;
  k.in.anchors.anchors.zero_();  // every kept block anchored at 0: no context visible
  const AuditReport rep = audit_step(reference::drafter_step, k.c, k.w, k.target, k.in);
  EXPECT_TRUE(rep.ok()) << rep.format();
  for (const auto& r : rep.rows)
    if (r.name == "fc.weight") {
      EXPECT_EQ(r.grad_norm, 0.0);
    }
}

TEST(Audit, NoWeightedPositionMeansZeroGradients) {
  Case k;
  k.in.loss_mask.zero_();
  Rng rng(1);
  k.in.anchors = sample_anchors(k.in.loss_mask, k.c.data.max_anchors, rng);
  const AuditReport rep = audit_step(optimized::drafter_step, k.c, k.w, k.target, k.in);
  EXPECT_TRUE(rep.ok()) << rep.format();
}

TEST(Audit, ZeroedGradientIsAFinding) {
  // A step that silently zeroes one parameter's contribution: rule (c).
  Case k;
  DrafterWeights w = k.w;
  const StepFn scaled = [](const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                           const StepInputs& in) {
    DrafterWeights cut = w;
    // The final norm weight stays in the graph but with a zero gradient.
    cut.norm = w.norm * 0.0 + w.norm.detach();
    return optimized::drafter_step(c, cut, f, in);
  };
  const AuditReport rep = audit_step(scaled, k.c, w, k.target, k.in);
  EXPECT_TRUE(rep.has('c')) << rep.format();
}

}  // namespace
}  // namespace dflash::harness
