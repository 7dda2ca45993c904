// Nightly: the finite-difference check over generated configurations (every
// shape corner the generator reaches), not just the quick suite's table.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "harness/generators.h"
#include "harness/gradcheck.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

RC_GTEST_PROP(ReferenceGradcheckNightly, GeneratedConfigsMatchFiniteDifferences, ()) {
  Config c = *gen_micro_config();
  // D-PACE's weights depend on the drafter's own CE and are detached by
  // design (docs/LOSSES.md, as Model-Optimizer does): finite differences
  // would see them move where autograd does not. alpha = 1 makes them
  // constant, so the difference sees the weighted path exactly (as the quick
  // row dpace_alpha_1_kl); the detachment itself is
  // optimized.Dpace.WeightsCarryNoGradient.
  if (c.loss.weighting == Weighting::kDpace) c.loss.dpace_alpha = 1.0;
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, *rc::gen::inRange<uint64_t>(0, 50));
  auto loss = [&] { return reference::drafter_step(c, w, target.frozen(), in).loss; };
  const GradcheckReport rep = gradcheck(loss, named(w), {4, 1e-3, 1e-6, 1e-3, c.run.seed});
  RC_LOG() << config_to_toml(c) << rep.format();
  RC_ASSERT(rep.ok);
}

}  // namespace
}  // namespace dflash::harness
