// Calibration: the planner's formulas (harness/memory.h) against peaks
// measured by the allocator probe on a sweep of small float32 CPU configs,
// every component and the whole step within +-15%. The measured ratios are
// printed (DFLASH_VERBOSE=1) and tabulated in docs/PREFLIGHT.md.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/alloc_probe.h"
#include "fixtures/fixtures.h"
#include "harness/memory.h"
#include "harness/planner.h"
#include "harness/zoo.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"
#include "optimized/target.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

constexpr double kBand = 0.15;  // the issue's +-15%

struct Sweep {
  int64_t B, S, H, nh, nkv, hd, I, Nd, N, bs, V, chunk;
};
const Sweep kSweep[] = {
    {1, 256, 64, 4, 2, 16, 256, 1, 8, 8, 2048, 32},
    {2, 128, 128, 4, 4, 32, 384, 2, 4, 16, 4096, 64},
    {1, 512, 32, 2, 1, 16, 96, 2, 16, 4, 1024, 48},
    {1, 384, 96, 6, 2, 16, 192, 3, 12, 8, 3000, 40},
};

Config config_of(const Sweep& w) {
  Config c = fixtures::micro_config();
  c.run.dtype = DType::kFloat32;
  c.target.vocab_size = w.V;
  c.target.num_hidden_layers = 2;
  LayerShape layer;  // rope_theta, rms_norm_eps: the defaults (1e6, 1e-6)
  layer.hidden_size = w.H, layer.intermediate_size = w.I, layer.head_dim = w.hd;
  layer.num_attention_heads = w.nh, layer.num_key_value_heads = w.nkv;
  c.target.shape = layer;
  c.drafter.shape = c.target.shape;
  c.drafter.num_hidden_layers = w.Nd;
  c.drafter.target_layer_ids = {0, 1};
  c.drafter.allow_last_layer_tap = true;
  c.data = DataConfig::batch("fixture", w.B, w.S, w.bs, w.N, w.V - 1);
  c.loss = fixtures::ce_kl_loss(/*kl_weight=*/0.5, w.chunk);
  c.optimized.attention_tile = 64;
  validate_config(c);
  return c;
}

void expect_within(const std::string& what, double measured, double predicted) {
  const double ratio = predicted / measured;
  EXPECT_NEAR(ratio, 1.0, kBand) << what << ": predicted " << predicted << " measured " << measured;
  if (std::getenv("DFLASH_VERBOSE"))
    fmt::print("  {:<40} predicted/measured {:.3f}\n", what, ratio);
}

class Calibration : public ::testing::TestWithParam<Sweep> {
 protected:
  void SetUp() override {
    AllocProbe::install();
    c = config_of(GetParam());
    target = make_target(c);
    w = make_drafter(c);
    in = fixtures::make_step_inputs(c, target, 0);
    in.anchors.keep.fill_(true);  // every block kept: Q is exactly N * bs
    layout = make_draft_layout(in.input_ids, in.loss_mask, in.anchors, c.data.block_size,
                               c.data.mask_token_id, c.loss.gamma);
    Q = layout.noise_ids.size(1);
  }
  int64_t held(bool checkpoint, bool sparse) {
    Config cc = c;
    cc.optimized.checkpoint_layers = checkpoint;
    cc.optimized.sparse_attention = sparse;
    const int64_t before = AllocProbe::live_bytes();
    const at::Tensor D = optimized::drafter_hidden(cc, w, target.frozen(), in, layout);
    return AllocProbe::live_bytes() - before;
  }
  Config c;
  TargetWeights target;
  DrafterWeights w;
  StepInputs in;
  DraftLayout layout;
  int64_t Q = 0;
};

TEST_P(Calibration, ActivationsAndContext) {
  const Sweep& s = GetParam();
  int64_t ctx;
  {
    const int64_t before = AllocProbe::live_bytes();
    const at::Tensor C = reference::draft_context(w, in.features, 1e-6);
    ctx = AllocProbe::live_bytes() - before;
  }
  expect_within("context projection", double(ctx), context_bytes(s.B, s.S, s.H, 4).bytes);
  const int64_t ck = held(true, true), plain = held(false, true), dense = held(false, false);
  const AttentionSizes z = AttentionSizes::of(c.drafter.shape, s.B, Q, s.S);
  expect_within(
      "checkpointed drafter (saved)", double(ck),
      checkpointed_saved_bytes(s.Nd, z, s.H, 4).bytes + context_bytes(s.B, s.S, s.H, 4).bytes);
  expect_within("one layer's activations", double(plain - ck) / double(s.Nd),
                layer_activation_bytes(s.B, Q, s.S, c.drafter.shape, 4).bytes);
  expect_within("dense attention (saved, one layer)", double(dense - plain) / double(s.Nd),
                dense_attention_saved_bytes(z, 4).bytes);
}

// dflash's own target forward (optimized::target_forward): the causal
// attention of one layer in query chunks, against the planner's term for it
// (harness/memory.h), and the dense attention of the reference target.
TEST_P(Calibration, TargetAttention) {
  const Sweep& s = GetParam();
  const int64_t S = 4 * s.S, q = S / 8;  // longer contexts than the drafter's, 8 chunks
  const at::Tensor qh = at::randn({s.B, s.nh, S, s.hd}), k = at::randn({s.B, s.nkv, S, s.hd}),
                   v = at::randn({s.B, s.nkv, S, s.hd});
  auto peak_of = [&](int64_t chunk) {
    AllocProbe::Scope scope;
    const at::Tensor out = optimized::chunked_causal_attention(qh, k, v, chunk);
    return double(scope.peak_delta());
  };
  AttentionSizes z;
  z.B = s.B, z.nh = s.nh, z.nkv = s.nkv, z.S = S, z.hd = s.hd;
  z.Q = q;
  expect_within("target attention, query-chunked", peak_of(q), target_attention_bytes(z, 4).bytes);
  z.Q = S;
  expect_within("target attention, dense", peak_of(S), target_attention_bytes(z, 4).bytes);
}

TEST_P(Calibration, AttentionAndLosses) {
  const Sweep& s = GetParam();
  const at::Tensor q = at::randn({s.B, s.nh, Q, s.hd}).requires_grad_(),
                   k = at::randn({s.B, s.nkv, s.S + Q, s.hd}).requires_grad_(),
                   v = at::randn({s.B, s.nkv, s.S + Q, s.hd}).requires_grad_();
  int64_t att;
  {
    AllocProbe::Scope scope;
    optimized::draft_attention(q, k, v, in.anchors, s.S, s.bs, 64).backward(at::randn_like(q));
    att = scope.peak_delta();
  }
  expect_within(
      "sparse attention", double(att),
      sparse_attention_bytes(AttentionSizes::of(c.drafter.shape, s.B, Q, s.S), 64, 4, 4).bytes);
  const int64_t H = s.H, V = s.V, M = layout.counted.sum().item<int64_t>();
  const at::Tensor D = at::randn({s.B, Q, H}).requires_grad_();
  auto loss_peak = [&](const LossFn& fn) {
    AllocProbe::Scope scope;
    fn(c, D, in.target_hidden, target.lm_head, layout, in.anchors).loss.backward();
    D.mutable_grad().reset();
    return double(scope.peak_delta());
  };
  const int64_t C = std::min(s.chunk, M);
  LossSizes z;
  z.M = M, z.Ns = s.B * Q, z.H = H, z.V = V, z.C = C;
  expect_within("fused chunked loss", loss_peak(optimized::loss_and_metrics),
                chunked_loss_bytes(z, true, 4).bytes);
  expect_within("chunked loss without recompute", loss_peak(no_recompute_loss()),
                chunked_no_recompute_loss_bytes(M, V, C, true, 4).bytes);
  expect_within("unchunked loss", loss_peak(reference::loss_and_metrics),
                unchunked_loss_bytes(s.B * Q, V, true, 4).bytes);
}

TEST_P(Calibration, WholeStep) {
  // Live at the start: weights, frozen tensors, inputs. The planner's peak
  // minus those items is what the step itself allocates at its peak.
  for (bool checkpoint : {true, false}) {
    Config cc = c;
    cc.optimized.checkpoint_layers = checkpoint;
    PlanVariant v = configured_variant(cc);
    const auto items = drafter_items(cc, v, Q, /*with_optimizer=*/false);
    double resident = 0;
    for (const auto& i : items)
      if (i.name == "drafter master weights" || i.name == "frozen embedding + LM head" ||
          i.name == "target features + hidden (received)")
        resident += i.bytes;
    for (auto& [n, t] : named(w)) t.mutable_grad().reset();
    AllocProbe::Scope scope;
    run_step(optimized::drafter_step, cc, w, target.frozen(), in);
    const double measured = double(scope.peak_delta());
    if (std::getenv("DFLASH_VERBOSE"))
      for (const auto& i : items)
        fmt::print("    {:<56} {:>10.0f} kind {}\n", i.name, i.bytes, int(i.kind));
    expect_within(checkpoint ? "whole step (checkpointed)" : "whole step", measured,
                  peak_of(items, cc.drafter.num_hidden_layers) - resident);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, Calibration, ::testing::ValuesIn(kSweep), [](const auto& i) {
  const Sweep& s = i.param;
  return fmt::format("B{}_S{}_H{}_layers{}", s.B, s.S, s.H, s.Nd);
});

}  // namespace
}  // namespace dflash::harness
