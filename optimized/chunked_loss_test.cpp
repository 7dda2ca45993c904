// The fused chunked loss against reference::loss_and_metrics: forward values,
// metrics and the student gradient, float64 tight and float32 by the error
// ratio, on awkward chunkings, with a non-unit upstream gradient.
#include "optimized/chunked_loss.h"

#include <gtest/gtest.h>

#include "core/alloc_probe.h"
#include "fixtures/fixtures.h"
#include "harness/tolerance.h"
#include "reference/step.h"

namespace dflash::optimized {
namespace {

struct LossCase {
  const char* name;
  int64_t B, S, bs, max_anchors, H, V, chunk;
  double ce_weight, kl_weight, temperature, gamma;
  bool holes;  // loss-mask holes, so whole chunks can carry zero weight
};

// chunk sizes: not dividing the weighted rows, larger than Q, 1, whole Q.
const LossCase kCases[] = {
    {"chunk_not_dividing", 2, 24, 4, 5, 16, 40, 7, 1.0, 0.5, 1.0, 2.0, false},
    {"chunk_larger_than_q", 2, 16, 3, 3, 8, 30, 100, 1.0, 0.5, 1.5, 0.0, false},
    {"chunk_of_one_row", 1, 12, 4, 2, 8, 20, 1, 0.7, 0.3, 0.8, 1.0, false},
    {"whole_q_in_one_chunk", 3, 20, 5, 3, 12, 33, 0, 1.0, 1.0, 2.0, 3.0, true},
    {"zero_weight_chunks", 4, 24, 4, 4, 8, 24, 3, 1.0, 0.25, 1.0, 0.5, true},
    {"ce_only", 2, 20, 4, 4, 16, 64, 5, 1.0, 0.0, 1.0, 2.0, false},
    {"kl_only_hot", 2, 20, 4, 4, 16, 64, 6, 0.0, 1.0, 0.6, 0.0, false},
};

struct LossInputs {
  at::Tensor D, Ht, W;  // float64 originals
  DraftLayout layout;
  Anchors anchors;
};

LossInputs make_inputs(const LossCase& c, uint64_t seed) {
  at::manual_seed(int64_t(seed));
  LossInputs in;
  at::Tensor mask = at::rand({c.B, c.S}) > (c.holes ? 0.4 : 0.1);
  if (c.B > 1) mask[c.B - 1].fill_(false);  // one row with no candidate at all
  Rng rng(seed);
  in.anchors = sample_anchors(mask, c.max_anchors, rng);
  const at::Tensor ids = at::randint(c.V, {c.B, c.S}, at::kLong);
  in.layout = make_draft_layout(ids, mask, in.anchors, c.bs, c.V - 1, c.gamma);
  const int64_t Q = in.layout.noise_ids.size(1);
  in.D = at::randn({c.B, Q, c.H}, at::kDouble);
  in.Ht = at::randn({c.B, c.S, c.H}, at::kDouble);
  in.W = at::randn({c.V, c.H}, at::kDouble) * 0.7;
  return in;
}

struct LossRun {
  StepOutputs out;
  at::Tensor grad;  // dD of (g * loss)
};

LossRun run(decltype(&reference::loss_and_metrics) fn, const LossCase& lc, const LossInputs& in,
            at::ScalarType dtype, double upstream, Kernels kernels = Kernels::kHost) {
  Config c = fixtures::micro_config();
  c.loss = LossConfig{};
  c.loss.ce_weight = lc.ce_weight, c.loss.kl_weight = lc.kl_weight;
  c.loss.temperature = lc.temperature, c.loss.gamma = lc.gamma, c.loss.chunk_size = lc.chunk;
  c.optimized.kernels = kernels_name(kernels);
  const at::Tensor leaf = in.D.detach().to(dtype).clone().requires_grad_(true);
  const at::Tensor D = leaf * 1.0;  // a non-leaf, as in the step
  LossRun r;
  r.out = fn(c, D, in.Ht.to(dtype), in.W.to(dtype), in.layout, in.anchors);
  (r.out.loss * upstream).backward();
  r.grad = leaf.grad();
  return r;
}

// The compared outputs; the metrics count argmax hits: exact.
harness::NamedOutputs outputs(const LossRun& r) {
  return {{"loss", r.out.loss},       {"ce", r.out.ce},
          {"kl", r.out.kl},           {"grad.student_hidden", r.grad},
          {"correct", r.out.correct}, {"accept_sum", r.out.accept_sum}};
}

harness::ComparisonReport compare_runs(const LossRun& opt, const LossRun& same, const LossRun& r64,
                                       const harness::Tolerance& tol) {
  return harness::compare_outputs(outputs(opt), outputs(same), outputs(r64), tol);
}

// Every case on both implementations of the row work (optimized/kernels.h).
class ChunkedLossParity : public ::testing::TestWithParam<std::tuple<LossCase, Kernels>> {
 protected:
  const LossCase& lc() const { return std::get<0>(GetParam()); }
  Kernels kernels() const { return std::get<1>(GetParam()); }
};

TEST_P(ChunkedLossParity, Float64Tight) {
  const LossInputs in = make_inputs(lc(), 7);
  const LossRun ref = run(reference::loss_and_metrics, lc(), in, at::kDouble, 0.37);
  const LossRun opt = run(loss_and_metrics, lc(), in, at::kDouble, 0.37, kernels());
  // Both float64: the only difference is summation order (~1e-16 relative).
  const auto rep = compare_runs(opt, ref, ref, {1.0, 1e-11});
  EXPECT_TRUE(rep.ok()) << rep.format();
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
  EXPECT_TRUE(at::equal(opt.out.counted, ref.out.counted));
}

TEST_P(ChunkedLossParity, Float32ErrorRatio) {
  const LossInputs in = make_inputs(lc(), 8);
  const LossRun r64 = run(reference::loss_and_metrics, lc(), in, at::kDouble, -1.9);
  const LossRun r32 = run(reference::loss_and_metrics, lc(), in, at::kFloat, -1.9);
  const LossRun opt = run(loss_and_metrics, lc(), in, at::kFloat, -1.9, kernels());
  // fp32 with another summation order and a 1e-7-accurate exp: within 4x the
  // reference's own fp32 error, plus 2^-21 of the scale (4 fp32 ulps: a sum
  // of V terms in the kernel's lane order, 8 lanes with AVX2, 16 with
  // AVX-512, lands a few ulps off where the reference's pairwise sum
  // happens to be exact).
  const auto rep = compare_runs(opt, r32, r64, {4.0, 0x1p-21});
  EXPECT_TRUE(rep.ok()) << rep.format();
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
}

INSTANTIATE_TEST_SUITE_P(Shapes, ChunkedLossParity,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(Kernels::kHost, Kernels::kAten)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param).name) + "_" +
                                  kernels_name(std::get<1>(i.param));
                         });

TEST(ChunkedLoss, LmHeadNeverGetsAGradient) {
  for (const char* kernels : {"host", "aten"}) {
    const LossInputs in = make_inputs(kCases[0], 3);
    Config c = fixtures::micro_config();
    c.optimized.kernels = kernels;
    const at::Tensor W = in.W.clone().requires_grad_(true);
    const at::Tensor D = in.D.clone().requires_grad_(true);
    loss_and_metrics(c, D, in.Ht, W, in.layout, in.anchors).loss.backward();
    EXPECT_TRUE(D.grad().defined()) << kernels;
    EXPECT_FALSE(W.grad().defined()) << kernels;
  }
}

TEST(Kernels, AutoIsHostOnCpuAndAtenElsewhere) {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  EXPECT_EQ(resolve_kernels("auto", cpu), Kernels::kHost);
  EXPECT_EQ(resolve_kernels("auto", cuda), Kernels::kAten);
  EXPECT_EQ(resolve_kernels("aten", cpu), Kernels::kAten);
  EXPECT_EQ(resolve_kernels("host", cpu), Kernels::kHost);
  try {
    resolve_kernels("host", cuda);
    ADD_FAILURE() << "host kernels accepted a CUDA device";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("optimized.kernels = \"host\""), std::string::npos)
        << e.what();
  }
}

// The ATen row work on the same chunk as the host kernel, bit for bit where
// the math allows: float64 rows agree to rounding, argmax exactly.
TEST(Kernels, AtenRowsMatchHostRowsInFloat64) {
  at::manual_seed(11);
  const int64_t M = 37, H = 8, V = 53;
  const at::Tensor student = at::randn({M, H}, at::kDouble),
                   teacher = at::randn({M, H}, at::kDouble);
  const at::Tensor W = at::randn({V, H}, at::kDouble);
  const at::Tensor rows = at::arange(M, at::kLong), labels = at::randint(V, {M}, at::kLong);
  const at::Tensor weights = at::rand({M}, at::kDouble);
  const LossConfig L{0.6, 0.4, 1.3, 0.0, 5};
  at::Tensor grads[2];
  ChunkedLossOut out[2];
  for (Kernels k : {Kernels::kHost, Kernels::kAten}) {
    const at::Tensor x = student.clone().requires_grad_(true);
    out[int(k)] = chunked_lm_loss(x, teacher, W, rows, rows, labels, weights, L, 5, k);
    out[int(k)].num.backward();
    grads[int(k)] = x.grad();
  }
  EXPECT_TRUE(at::allclose(out[0].ce, out[1].ce, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(out[0].kl, out[1].kl, 1e-12, 1e-12));
  EXPECT_TRUE(at::equal(out[0].argmax, out[1].argmax));
  EXPECT_TRUE(at::allclose(grads[0], grads[1], 1e-12, 1e-12));
}

TEST(ChunkedLoss, NoGradientWorkUnderNoGrad) {
  const LossInputs in = make_inputs(kCases[0], 4);
  Config c = fixtures::micro_config();
  c.loss.chunk_size = 3;
  const at::Tensor D = in.D.clone().requires_grad_(true);
  auto& stats = chunked_loss_stats();
  const int64_t chunks0 = stats.chunks, grads0 = stats.gradient_chunks;
  {
    at::NoGradGuard no_grad;
    const StepOutputs o = loss_and_metrics(c, D, in.Ht, in.W, in.layout, in.anchors);
    EXPECT_FALSE(o.loss.requires_grad());
  }
  EXPECT_GT(stats.chunks - chunks0, 1);
  EXPECT_EQ(stats.gradient_chunks - grads0, 0);
}

TEST(ChunkedLoss, AllZeroWeightsGiveZeroLossAndGradient) {
  LossInputs in = make_inputs(kCases[0], 5);
  in.layout.weights.zero_();
  in.layout.counted.zero_();
  Config c = fixtures::micro_config();
  const at::Tensor D = in.D.clone().requires_grad_(true);
  const StepOutputs o = loss_and_metrics(c, D, in.Ht, in.W, in.layout, in.anchors);
  o.loss.backward();
  EXPECT_EQ(o.loss.item<double>(), 0.0);
  EXPECT_EQ(D.grad().abs().max().item<double>(), 0.0);
}

}  // namespace
}  // namespace dflash::optimized
