// The optimized step against the reference step (tolerances: the dtype rules
// of harness/parity.h): every component switch combination float64 tight,
// tiny.toml in float32 by the error ratio, and bfloat16 against the bfloat16
// reference.
#include "optimized/step.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "harness/parity.h"

namespace dflash::optimized {
namespace {

Config tiny() {
  const char* root = std::getenv("DFLASH_SOURCE_DIR");
  return load_config(std::string(root ? root : ".") + "/fixtures/configs/tiny.toml");
}

class SwitchCombos : public ::testing::TestWithParam<int> {};

TEST_P(SwitchCombos, Float64Tight) {
  Config c = fixtures::micro_config();
  c.loss.chunk_size = 5;  // does not divide Q
  c.optimized.chunked_loss = GetParam() & 1;
  c.optimized.sparse_attention = GetParam() & 2;
  c.optimized.checkpoint_layers = GetParam() & 4;
  c.optimized.attention_tile = 3;
  const auto rep = harness::step_parity(drafter_step, c, 2);
  EXPECT_TRUE(rep.ok()) << rep.format(config_to_toml(c));
}

INSTANTIATE_TEST_SUITE_P(Optimized, SwitchCombos, ::testing::Range(0, 8), [](const auto& i) {
  return fmt::format("chunked{}_sparse{}_checkpoint{}", i.param & 1, (i.param >> 1) & 1,
                     (i.param >> 2) & 1);
});

TEST(OptimizedStep, TinyTomlFloat32ErrorRatio) {
  Config c = tiny();
  c.optimized.checkpoint_layers = true;
  const auto rep = harness::step_parity(drafter_step, c, 0);
  EXPECT_TRUE(rep.ok()) << rep.format(config_to_toml(c));
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
}

TEST(OptimizedStep, TinyTomlBfloat16ErrorRatio) {
  Config c = tiny();
  c.run.dtype = DType::kBFloat16;
  const auto rep = harness::step_parity(drafter_step, c, 0);
  EXPECT_TRUE(rep.ok()) << rep.format(config_to_toml(c));
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
}

}  // namespace
}  // namespace dflash::optimized
