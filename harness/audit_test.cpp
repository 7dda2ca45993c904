// The audit's rules on the real steps: the per-parameter table, the
// context-blind exception to rule (c), and a step with no weighted position.
#include "harness/audit.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "harness/step_dump.h"
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

// `dflash audit --from FILE`: the rules on the gradients recorded in a dump
// (another trainer's), each tampering a trainer could produce.
AuditReport audit_tampered(const std::function<void(NamedTensors&)>& tamper) {
  testing_support::TmpDir tmp;
  Case k;
  const StepResult r = run_step(reference::drafter_step, k.c, k.w, k.target.frozen(), k.in);
  const std::string path = tmp / "dump.safetensors";
  write_step_dump(path, k.c, k.w, k.target.frozen(), k.in, r);
  safetensors::File f = safetensors::read(path);
  tamper(f.tensors);
  safetensors::write(path, f.tensors, f.metadata);
  return audit_recorded(read_step_dump(path));
}

at::Tensor& named_tensor(NamedTensors& t, const std::string& name) {
  for (auto& [n, v] : t)
    if (n == name) return v;
  throw std::runtime_error("no tensor " + name);
}

TEST(AuditRecorded, ACleanDumpPasses) {
  const AuditReport rep = audit_tampered([](NamedTensors&) {});
  EXPECT_TRUE(rep.ok()) << rep.format();
  EXPECT_NE(rep.format().find("not recorded, so not audited"), std::string::npos);
}

TEST(AuditRecorded, AFrozenGradientIsB) {
  const AuditReport rep = audit_tampered([](NamedTensors& t) {
    t.emplace_back("grad.lm_head.weight", at::ones_like(named_tensor(t, "lm_head.weight")));
  });
  EXPECT_TRUE(rep.has('b')) << rep.format();
  EXPECT_NE(rep.format().find("finding (b) lm_head.weight: frozen tensor has a recorded gradient"),
            std::string::npos)
      << rep.format();
}

TEST(AuditRecorded, AMissingGradientIsA) {
  const AuditReport rep = audit_tampered([](NamedTensors& t) {
    NamedTensors kept;
    for (auto& p : t)
      if (p.first != "grad.layers.0.mlp.up_proj.weight") kept.push_back(p);
    t = kept;
  });
  EXPECT_NE(rep.format().find("finding (a) layers.0.mlp.up_proj.weight: no gradient recorded"),
            std::string::npos)
      << rep.format();
}

TEST(AuditRecorded, AZeroOrNonFiniteGradientIsC) {
  const AuditReport zero =
      audit_tampered([](NamedTensors& t) { named_tensor(t, "grad.norm.weight").zero_(); });
  EXPECT_NE(zero.format().find("finding (c) norm.weight: gradient exactly zero"), std::string::npos)
      << zero.format();
  const AuditReport nan = audit_tampered(
      [](NamedTensors& t) { named_tensor(t, "grad.fc.weight").view(-1)[0] = std::nan(""); });
  EXPECT_NE(nan.format().find("finding (c) fc.weight: gradient not finite"), std::string::npos)
      << nan.format();
}

}  // namespace
}  // namespace dflash::harness
