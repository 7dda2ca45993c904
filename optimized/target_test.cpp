// The query-chunked target forward against the dense reference (float64,
// chunk sizes that divide S, do not, are 1, and exceed S), and its memory:
// the scores it holds scale with the chunk, not with S x S.
#include "optimized/target.h"

#include <gtest/gtest.h>

#include "core/alloc_probe.h"
#include "fixtures/fixtures.h"

namespace dflash::optimized {
namespace {

Config target_config(int64_t S, int64_t chunk) {
  Config c = fixtures::micro_config();  // float64, GQA
  c.data.seq_len = S;
  c.optimized.target_query_chunk = chunk;
  return c;
}

class ChunkedTarget : public ::testing::TestWithParam<int64_t> {};

TEST_P(ChunkedTarget, EqualsTheDenseForwardInFloat64) {
  const Config c = target_config(23, GetParam());
  const TargetWeights w = make_target(c);
  const fixtures::Batch b = fixtures::make_batch(c, 3);
  const reference::TargetOutputs dense = reference::target_forward(c, w, b.input_ids);
  const reference::TargetOutputs chunked = target_forward(c, w, b.input_ids);
  // float64: chunked score GEMMs round differently from the whole-matrix one
  // in the last bits only.
  EXPECT_TRUE(at::allclose(chunked.features, dense.features, 1e-12, 1e-13))
      << (chunked.features - dense.features).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(chunked.final_hidden, dense.final_hidden, 1e-12, 1e-13));
}

INSTANTIATE_TEST_SUITE_P(Chunks, ChunkedTarget, ::testing::Values(1, 5, 8, 23, 100),
                         [](const auto& i) { return "chunk_" + std::to_string(i.param); });

TEST(ChunkedTarget, ScoresScaleWithTheChunk) {
  AllocProbe::install();
  Config c = target_config(512, 0);
  c.data.batch_size = 1;
  const TargetWeights w = make_target(c);
  const at::Tensor ids = at::randint(0, 30, {1, 512}, at::kLong);
  auto peak = [&](int64_t chunk) {
    c.optimized.target_query_chunk = chunk;
    AllocProbe::Scope s;
    target_forward(c, w, ids);
    return s.peak_delta();
  };
  const int64_t dense = peak(0), chunked = peak(32);
  // Dense holds (1, 4, 512, 512) float64 scores (8 MiB) and a bool mask; the
  // chunked forward (1, 4, 32, <= 512) at a time.
  RecordProperty("dense_bytes", std::to_string(dense));
  RecordProperty("chunked_bytes", std::to_string(chunked));
  EXPECT_LT(chunked * 4, dense) << "chunked " << chunked << " B, dense " << dense << " B";
}

}  // namespace
}  // namespace dflash::optimized
