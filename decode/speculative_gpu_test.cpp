// Served speculative decoding on a GPU (label `gpu`, docs/GPU.md, docs/EVAL.md):
// the same code as the CPU suite with the target and drafter on cuda:0.
// Block and tree decoding on CUDA commit exactly CUDA's plain greedy text,
// which in float64 is the CPU's. Skipped with the reason where there is no
// CUDA device.
#include <gtest/gtest.h>

#include "core/device.h"
#include "decode/speculative_test_support.h"
#include "fixtures/fixtures.h"

namespace dflash::decode {
namespace {

TEST(SpeculativeOnCuda, BlockAndTreeDecodingAreLosslessOnTheDevice) {
  if (const std::string why = cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const c10::Device cuda(c10::kCUDA, 0);
  for (uint64_t seed : {1, 2, 3}) {
    Config c = testing::small_config();
    c.run.seed = seed;
    TargetWeights t = make_target(c);
    DrafterWeights w = make_drafter(c);
    const std::vector<int64_t> prompt = {int64_t(seed), 5, 9, 2};
    const DecodeOptions base{4, 40, 64, c.data.mask_token_id, -1, 0};
    const DecodeResult cpu = greedy_decode(c, t, prompt, base);
    to_device(t, cuda), to_device(w, cuda);
    const DecodeResult gpu = greedy_decode(c, t, prompt, base);
    EXPECT_EQ(gpu.tokens, cpu.tokens) << "seed " << seed;  // float64
    for (int64_t budget : {0, 1, 16}) {
      DecodeOptions o = base;
      o.tree_budget = budget;
      DFlashDrafter d(c, w, t.frozen(), o.block_size);
      const DecodeResult s = speculative_decode(c, t, d, prompt, o);
      EXPECT_EQ(s.tokens, gpu.tokens) << "seed " << seed << " budget " << budget;
      testing::OracleDrafter oracle(gpu.tokens, int64_t(prompt.size()), c.target.vocab_size, seed,
                                    budget > 1 ? 1.0 : 0.0);
      EXPECT_EQ(speculative_decode(c, t, oracle, prompt, o).tokens, gpu.tokens)
          << "oracle, seed " << seed << " budget " << budget;
    }
  }
}

}  // namespace
}  // namespace dflash::decode
