// Nightly: the lossless properties of speculative decoding at longer
// prompts and generations than the quick suite's (ci/nightly.sh raises the
// case count too).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "decode/speculative_test_support.h"
#include "fixtures/fixtures.h"

namespace dflash::decode {
namespace {

RC_GTEST_PROP(SpeculativeNightly, BlockAndTreeDecodingAreLosslessAtLength, ()) {
  testing::DecodeCase k = *testing::gen_decode_case(40, 96);
  const TargetWeights t = make_target(k.c);
  const DrafterWeights w = make_drafter(k.c);
  const DecodeResult g = greedy_decode(k.c, t, k.prompt, k.o);
  for (int64_t budget : {0, 1, 5, 32}) {
    k.o.tree_budget = budget;
    DFlashDrafter d(k.c, w, t.frozen(), k.o.block_size);
    RC_ASSERT(speculative_decode(k.c, t, d, k.prompt, k.o).tokens == g.tokens);
    testing::OracleDrafter oracle(g.tokens, int64_t(k.prompt.size()), k.c.target.vocab_size,
                                  k.seed + uint64_t(budget), budget > 1 ? 1.0 : 0.0,
                                  k.o.stop_token);
    const DecodeResult so = speculative_decode(k.c, t, oracle, k.prompt, k.o);
    RC_ASSERT(so.tokens == g.tokens);
    if (budget <= 1) RC_ASSERT(testing::drafted_accepts(so) == oracle.expected_accepts());
  }
}

}  // namespace
}  // namespace dflash::decode
