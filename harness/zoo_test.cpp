// The bug zoo: every mutant is killed by the check meant for it, and the
// unmutated code passes that same check.
#include "harness/zoo.h"

#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "harness/audit.h"
#include "harness/properties.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

// Every mutant, with the step's loss and attention on each implementation
// (optimized/kernels.h): a mutant must die whichever kernels run.
class Zoo : public ::testing::TestWithParam<std::tuple<Mutant, optimized::Kernels>> {};

TEST_P(Zoo, KilledByTheCheckMeantForIt) {
  const auto& [m, kernels] = GetParam();
  const KillRow r = run_mutant(m, run_from_env(100, 7), kernels);
  EXPECT_TRUE(r.killed) << m.name << " survived its " << m.meant_for << " check on "
                        << optimized::kernels_name(kernels) << " kernels";
  EXPECT_EQ(r.caught_by, m.meant_for);
  EXPECT_FALSE(r.detail.empty()) << "a kill must come with a readable message";
  std::cout << kill_table({r}) << r.detail << "\n";
}

INSTANTIATE_TEST_SUITE_P(Mutants, Zoo,
                         ::testing::Combine(::testing::ValuesIn(zoo()),
                                            ::testing::Values(optimized::Kernels::kHost,
                                                              optimized::Kernels::kAten)),
                         [](const auto& i) {
                           return std::get<0>(i.param).name + "_" +
                                  optimized::kernels_name(std::get<1>(i.param));
                         });

// The unmutated code under the same checks.
TEST(ZooControls, RealComponentsPassTheMemoryChecks) {
  const AttentionFn sparse = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                                optimized::Kernels kernels) {
    return optimized::draft_attention(q, k, v, a, S, bs, tile, kernels);
  };
  for (optimized::Kernels k : {optimized::Kernels::kHost, optimized::Kernels::kAten}) {
    const MemoryVerdict att = attention_memory_check(sparse, k);
    EXPECT_TRUE(att.ok) << att.measured << " > " << att.ceiling << ": " << att.text;
    const MemoryVerdict loss = loss_memory_check(optimized::loss_and_metrics, k);
    EXPECT_TRUE(loss.ok) << loss.measured << " > " << loss.ceiling << ": " << loss.text;
  }
}

TEST(ZooControls, RealStepsPassTheAudit) {
  Config c = fixtures::micro_config();
  c.optimized.checkpoint_layers = true;
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const AuditReport ref = audit_step(reference::drafter_step, c, w, target, in);
  EXPECT_TRUE(ref.ok()) << ref.format();
  const AuditReport opt = audit_step(optimized::drafter_step, c, w, target, in);
  EXPECT_TRUE(opt.ok()) << opt.format();
  EXPECT_EQ(opt.checkpoint_regions, c.drafter.num_hidden_layers);
}

TEST(ZooControls, GlobalTwoShardSplitPassesParity) {
  const PropertyOutcome o =
      check_step_parity(two_shard_step, run_from_env(100, 8), "parity.two_shard");
  EXPECT_TRUE(o.passed) << o.report << o.counterexample;
}

}  // namespace
}  // namespace dflash::harness
