// The parity properties on the real optimized code (100+ cases each; the
// nightly suite sets DFLASH_CASES and a fresh DFLASH_SEED).
#include <gtest/gtest.h>

#include "harness/properties.h"
#include "optimized/checkpoint.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"

namespace dflash::harness {
namespace {

// A failure prints the report and writes the replayable case under
// $DFLASH_OUT_DIR (default: the system's temp directory).
void expect_passed(const PropertyOutcome& o) {
  if (!o.passed) {
    const char* dir = std::getenv("DFLASH_OUT_DIR");
    ADD_FAILURE() << o.name << " FAILED after " << o.cases_passed << " passing cases (seed "
                  << o.seed << "), minimal case " << o.size << "\n"
                  << o.report
                  << save_counterexample(o, dir ? dir : ::testing::TempDir() + "dflash-parity");
  }
  EXPECT_GE(o.cases_passed, 100);
}

TEST(Parity, OptimizedStepMatchesReference) {
  expect_passed(check_step_parity(optimized::drafter_step, run_from_env(150, 1)));
}

TEST(Parity, ChunkedLossMatchesReference) {
  expect_passed(check_loss_parity(optimized::loss_and_metrics, run_from_env(200, 2)));
}

TEST(Parity, SparseAttentionMatchesReference) {
  const AttentionFn sparse = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                                optimized::Kernels kernels) {
    return optimized::draft_attention(q, k, v, a, S, bs, tile, kernels);
  };
  expect_passed(check_attention_parity(sparse, run_from_env(200, 3)));
}

TEST(Parity, CheckpointMatchesPlainAutograd) {
  expect_passed(check_checkpoint_parity(optimized::checkpoint, run_from_env(200, 4)));
}

}  // namespace
}  // namespace dflash::harness
