// The information-flow (leakage) audit on both builds: nothing leaks on the
// real steps (several shapes: rows with fewer anchors, checkpointed layers,
// tiles smaller than a block), the audit is not vacuous (blocks read earlier
// context), and the zoo's anchor-visible attention is caught naming the
// block and the position. ci/mutants.toml's leakage_* mutants of the real
// masks (reference and the optimized host kernel) are killed by these tests.
#include "harness/leakage.h"

#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "harness/zoo.h"

namespace dflash::harness {
namespace {

struct Build {
  const char* name;
  HiddenFn hidden;
};

const Build kBuilds[] = {{"reference", reference_hidden()}, {"optimized", optimized_hidden()}};

Config shaped(int variant) {
  Config c = fixtures::micro_config();
  if (variant == 1) c.optimized.checkpoint_layers = true, c.optimized.attention_tile = 2;
  if (variant == 2) c.data.batch_size = 3, c.data.max_anchors = 4, c.data.seq_len = 20;
  return c;
}

class Leakage : public ::testing::TestWithParam<int> {};

TEST_P(Leakage, NothingLeaksInEitherBuild) {
  const Config c = shaped(GetParam());
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  for (uint64_t step = 0; step < 3; ++step) {
    const StepInputs in = fixtures::make_step_inputs(c, target, step);
    for (const Build& b : kBuilds) {
      const LeakageReport rep = audit_leakage(b.hidden, c, w, target.frozen(), in);
      EXPECT_TRUE(rep.ok()) << b.name << " step " << step << ": " << rep.format();
      EXPECT_GT(rep.blocks, 0) << b.name;
      EXPECT_GT(rep.sees_context, 0) << b.name << ": no block read context: a vacuous audit";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Leakage, ::testing::Values(0, 1, 2));

// The zoo's `<=` attention (context up to and including the anchor) through
// the optimized step's own forward: named by block and position.
TEST(LeakageZoo, AnchorVisibleAttentionIsNamed) {
  const Config c = fixtures::micro_config();
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const LeakageReport rep = audit_leakage(optimized_hidden(mutant_components("anchor_visible")), c,
                                          w, target.frozen(), in);
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.finding.find("depends on the target features at row"), std::string::npos)
      << rep.finding;
  EXPECT_NE(rep.finding.find(">= its anchor"), std::string::npos) << rep.finding;
}

}  // namespace
}  // namespace dflash::harness
