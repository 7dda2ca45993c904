// The optimized step against the reference step: every component switch
// combination float64 tight, tiny.toml in float32 by the error ratio, and a
// bfloat16 run against the bfloat16 reference.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "fixtures/fixtures.h"
#include "harness/parity.h"
#include "optimized/step.h"

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
  // float64 both sides: rounding-order differences only.
  const auto rep = harness::step_parity(drafter_step, c, 2, {1.0, 1e-10});
  EXPECT_TRUE(rep.ok()) << rep.format(config_to_toml(c));
}

INSTANTIATE_TEST_SUITE_P(Optimized, SwitchCombos, ::testing::Range(0, 8), [](const auto& i) {
  return fmt::format("chunked{}_sparse{}_checkpoint{}", i.param & 1, (i.param >> 1) & 1,
                     (i.param >> 2) & 1);
});

TEST(OptimizedStep, TinyTomlFloat32ErrorRatio) {
  Config c = tiny();
  c.optimized.checkpoint_layers = true;
  // fp32: 4x the fp32 reference's own error plus ~1 ulp of each tensor's scale.
  const auto rep = harness::step_parity(drafter_step, c, 0, {4.0, 1e-7});
  EXPECT_TRUE(rep.ok()) << rep.format(config_to_toml(c));
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
}

TEST(OptimizedStep, TinyTomlBfloat16ErrorRatio) {
  Config c = tiny();
  c.run.dtype = DType::kBFloat16;
  // bf16 compute (8-bit mantissa): the two builds round at different places
  // (tiles, chunks, fused softmax), so allow 4x the bf16 reference's own
  // error plus 1/256 (one bf16 ulp) of each tensor's scale.
  const auto rep = harness::step_parity(drafter_step, c, 0, {4.0, 1.0 / 256});
  EXPECT_TRUE(rep.ok()) << rep.format(config_to_toml(c));
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
}

}  // namespace
}  // namespace dflash::optimized
