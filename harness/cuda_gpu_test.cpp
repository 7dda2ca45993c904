// The GPU check's tests (label `gpu`, docs/GPU.md): the optimized build on a
// CUDA device against the float64 CPU reference, on generated configs, with
// the same properties and tolerances as the CPU suite; activation
// checkpointing's replay of the CUDA generator; memory ceilings read from the
// CUDA caching allocator. Without a CUDA device every test is skipped with
// the reason (ci/gpu-check.sh runs them where there is one).
#include <gtest/gtest.h>

#include "core/alloc_probe.h"
#include "core/device.h"
#include "fixtures/fixtures.h"
#include "harness/memory.h"
#include "harness/on_device.h"
#include "harness/properties.h"
#include "optimized/checkpoint.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"

namespace dflash::harness {
namespace {

// Slack on the device ceilings: the caching allocator rounds every block to
// 512 bytes and cuBLAS keeps a workspace (stated, not tuned per case).
constexpr double kSlack = 1.15;
constexpr double kSlackBytes = 8.0 * 1024 * 1024;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
    activate_device(dev_, "the gpu tests");
  }
  const c10::Device dev_{c10::kCUDA, 0};
};

TEST_F(Gpu, StepMatchesTheFloat64CpuReference) {
  const PropertyOutcome o = check_step_parity(on_device(optimized::drafter_step, dev_),
                                              run_from_env(60, 31), "gpu.parity.step");
  EXPECT_TRUE(o.passed) << o.report << o.counterexample;
}

TEST_F(Gpu, FusedLossMatchesTheFloat64CpuReference) {
  const PropertyOutcome o = check_loss_parity(on_device(optimized::loss_and_metrics, dev_),
                                              run_from_env(100, 32), "gpu.parity.loss");
  EXPECT_TRUE(o.passed) << o.report << o.counterexample;
}

TEST_F(Gpu, SparseAttentionMatchesTheFloat64CpuReference) {
  const AttentionFn sparse = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                                optimized::Kernels kernels) {
    return optimized::draft_attention(q, k, v, a, S, bs, tile, kernels);
  };
  const PropertyOutcome o = check_attention_parity(on_device(sparse, dev_), run_from_env(100, 33),
                                                   "gpu.parity.attention");
  EXPECT_TRUE(o.passed) << o.report << o.counterexample;
}

// Dropout inside a checkpointed region on the GPU: the recomputation must
// draw the same mask from the CUDA generator, so the gradients equal plain
// autograd's exactly.
TEST_F(Gpu, CheckpointReplaysTheCudaGenerator) {
  const auto o = at::TensorOptions().device(dev_).dtype(at::kFloat);
  const at::Tensor w = at::randn({16, 16}, o).requires_grad_(true);
  auto region = [&](const at::Tensor& x) {
    return at::dropout(at::tanh(at::matmul(x, w)), 0.5, true);
  };
  at::Tensor grads[2];
  for (int use_checkpoint = 0; use_checkpoint < 2; ++use_checkpoint) {
    const at::Tensor x0 = at::ones({8, 16}, o).requires_grad_(true);
    const at::Tensor x = x0 * 1.5;
    at::manual_seed(7);
    at::Tensor out;
    if (use_checkpoint)
      out = optimized::checkpoint({"region", {{"x", x}}, {}, {{"w", w}}},
                                  [&](const std::vector<at::Tensor>& g,
                                      const std::vector<at::Tensor>&) { return region(g[0]); });
    else
      out = region(x);
    at::manual_seed(99);  // the generator moves on before backward
    out.sum().backward();
    grads[use_checkpoint] = x0.grad().cpu();
  }
  EXPECT_TRUE(at::equal(grads[0], grads[1])) << "recomputed dropout differs";
  EXPECT_GT(grads[0].eq(0).sum().item<int64_t>(), 0) << "dropout dropped nothing";
}

TEST_F(Gpu, ChunkedLossUnderItsFormulaOnTheCudaProbe) {
  for (auto [Q, H, V, C, kl] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>>{
           {2048, 256, 32768, 256, true}, {4096, 128, 65536, 512, false}}) {
    const auto o = at::TensorOptions().device(dev_).dtype(at::kFloat);
    const auto idx = o.dtype(at::kLong);
    Config c = fixtures::micro_config();
    c.loss = fixtures::ce_kl_loss(kl ? 0.5 : 0.0, C);
    c.topology.device = dev_.str();
    const at::Tensor D = at::randn({1, Q, H}, o).requires_grad_(true), Ht = at::randn({1, Q, H}, o);
    const at::Tensor W = at::randn({V, H}, o);
    const fixtures::CountedRows rows = fixtures::every_row_counted(Q, V, idx);
    const DraftLayout& l = rows.layout;
    const Anchors& a = rows.anchors;
    int64_t peak;
    {
      AllocProbe::Scope scope(dev_);
      optimized::loss_and_metrics(c, D, Ht, W, l, a).loss.backward();
      peak = scope.peak_delta();
    }
    LossSizes z;
    z.M = z.Ns = Q, z.H = H, z.V = V, z.C = C;
    const Formula f = chunked_loss_bytes(z, kl, 4, optimized::Kernels::kAten);
    EXPECT_LE(double(peak), f.bytes * kSlack + kSlackBytes) << f.text << " measured " << peak;
    std::cout << "cuda loss measured/formula " << double(peak) / f.bytes << "\n";
  }
}

TEST_F(Gpu, SparseAttentionUnderItsFormulaOnTheCudaProbe) {
  const int64_t S = 4096, N = 64, bs = 16, nh = 16, nkv = 4, hd = 64, T = 256, Q = N * bs;
  const auto o = at::TensorOptions().device(dev_).dtype(at::kFloat);
  const at::Tensor q = at::randn({1, nh, Q, hd}, o).requires_grad_(true);
  const at::Tensor k = at::randn({1, nkv, S + Q, hd}, o).requires_grad_(true);
  const at::Tensor v = at::randn({1, nkv, S + Q, hd}, o).requires_grad_(true);
  const Anchors a{std::get<0>(at::randint(1, S - 1, {1, N}, at::kLong).sort(1)).to(dev_),
                  at::ones({1, N}, o.dtype(at::kBool))};
  int64_t peak;
  {
    AllocProbe::Scope scope(dev_);
    optimized::draft_attention(q, k, v, a, S, bs, T, optimized::Kernels::kAten)
        .backward(at::randn({1, nh, Q, hd}, o));
    peak = scope.peak_delta();
  }
  AttentionSizes z;
  z.nh = nh, z.nkv = nkv, z.Q = Q, z.S = S, z.hd = hd;
  const Formula f = sparse_attention_bytes(z, T, 4, 4, optimized::Kernels::kAten);
  EXPECT_LE(double(peak), f.bytes * kSlack + kSlackBytes) << f.text << " measured " << peak;
  std::cout << "cuda attention measured/formula " << double(peak) / f.bytes << "\n";
}

}  // namespace
}  // namespace dflash::harness
