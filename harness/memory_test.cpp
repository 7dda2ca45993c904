// Memory ceilings: measured peaks (c10 allocator probe) under the analytic
// working sets of harness/memory.h at several sizes, and the two scaling
// laws: the chunked loss's peak does not grow with Q beyond its O(Q*H)
// gradient, nor the attention's with S beyond its O(S*hd) key gradients.
#include "harness/memory.h"

#include <gtest/gtest.h>

#include "core/alloc_probe.h"
#include "fixtures/fixtures.h"
#include "harness/zoo.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

// Slack on every ceiling: allocator rounding, small index tensors and
// autograd bookkeeping the formulas leave out (stated, not tuned per case).
constexpr double kSlack = 1.15;
constexpr double kSlackBytes = 256 * 1024;

struct LossSetup {
  Config cfg;
  at::Tensor D, Ht, W;
  DraftLayout layout;
  Anchors anchors;
  int64_t M;
};

LossSetup loss_setup(int64_t Q, int64_t H, int64_t V, int64_t C, bool kl,
                     optimized::Kernels kernels) {
  LossSetup s;
  s.cfg = fixtures::micro_config();
  s.cfg.loss = fixtures::ce_kl_loss(kl ? 0.5 : 0.0, C);
  s.cfg.optimized.kernels = optimized::kernels_name(kernels);
  s.D = at::randn({1, Q, H}).requires_grad_(true);
  s.Ht = at::randn({1, Q, H});
  s.W = at::randn({V, H});
  fixtures::CountedRows rows = fixtures::every_row_counted(Q, V);
  s.layout = std::move(rows.layout);
  s.anchors = std::move(rows.anchors);
  s.M = Q;
  return s;
}

int64_t loss_peak(LossSetup& s) {
  AllocProbe::install();
  AllocProbe::Scope scope;
  optimized::loss_and_metrics(s.cfg, s.D, s.Ht, s.W, s.layout, s.anchors).loss.backward();
  s.D.mutable_grad().reset();
  return scope.peak_delta();
}

// Both implementations of the row work (optimized/kernels.h), each under its
// own formula.
class MemoryCeiling : public ::testing::TestWithParam<optimized::Kernels> {};

TEST_P(MemoryCeiling, ChunkedLossUnderItsFormula) {
  for (auto [Q, H, V, C, kl] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>>{
           {512, 64, 4096, 64, true}, {1024, 32, 8192, 128, false}, {256, 128, 2048, 100, true}}) {
    LossSetup s = loss_setup(Q, H, V, C, kl, GetParam());
    const int64_t peak = loss_peak(s);
    LossSizes z;
    z.M = z.Ns = Q, z.H = H, z.V = V, z.C = C;
    const Formula f = chunked_loss_bytes(z, kl, 4, GetParam());
    EXPECT_LE(double(peak), f.bytes * kSlack + kSlackBytes) << f.text << " measured " << peak;
    if (std::getenv("DFLASH_VERBOSE"))
      std::cout << "measured/formula " << double(peak) / f.bytes << "\n";
    EXPECT_GE(double(peak), f.bytes * 0.5) << "formula far above measurement: " << f.text;
  }
}

TEST_P(MemoryCeiling, ChunkedLossPeakDoesNotGrowWithQAtFixedChunk) {
  // Doubling Q may add the O(Q*H) gradient terms (2*4*H bytes per row, both
  // passes' copies), never a Q*V term: H = 16 and V = 8192 make one extra
  // logits row per position 512x larger than what is allowed.
  const int64_t H = 16, V = 8192, C = 64;
  LossSetup a = loss_setup(512, H, V, C, true, GetParam()),
            b = loss_setup(2048, H, V, C, true, GetParam());
  const int64_t pa = loss_peak(a), pb = loss_peak(b);
  const double allowed = (2048 - 512) * (2.0 * 4 * H + 64) + kSlackBytes;
  EXPECT_LE(double(pb - pa), allowed) << "peaks " << pa << " -> " << pb;
}

struct AttnSetup {
  at::Tensor q, k, v, dout;
  Anchors a;
  int64_t S, bs;
};

AttnSetup attn_setup(int64_t S, int64_t N, int64_t nh, int64_t nkv, int64_t hd) {
  AttnSetup s;
  s.S = S, s.bs = 16;
  const int64_t Q = N * s.bs;
  s.q = at::randn({1, nh, Q, hd}).requires_grad_(true);
  s.k = at::randn({1, nkv, S + Q, hd}).requires_grad_(true);
  s.v = at::randn({1, nkv, S + Q, hd}).requires_grad_(true);
  s.dout = at::randn({1, nh, Q, hd});
  s.a = {std::get<0>(at::randint(1, S - 1, {1, N}, at::kLong).sort(1)),
         at::ones({1, N}, at::kBool)};
  return s;
}

int64_t attn_peak(AttnSetup& s, int64_t tile, optimized::Kernels kernels) {
  AllocProbe::install();
  AllocProbe::Scope scope;
  optimized::draft_attention(s.q, s.k, s.v, s.a, s.S, s.bs, tile, kernels).backward(s.dout);
  for (at::Tensor* t : {&s.q, &s.k, &s.v}) t->mutable_grad().reset();
  return scope.peak_delta();
}

TEST_P(MemoryCeiling, SparseAttentionUnderItsFormula) {
  for (auto [S, N, nh, nkv, hd, T] : std::vector<std::array<int64_t, 6>>{
           {512, 8, 8, 2, 32, 64}, {1024, 16, 4, 4, 16, 128}, {256, 4, 8, 1, 64, 32}}) {
    AttnSetup s = attn_setup(S, N, nh, nkv, hd);
    const int64_t peak = attn_peak(s, T, GetParam());
    AttentionSizes z;
    z.nh = nh, z.nkv = nkv, z.Q = N * 16, z.S = S, z.hd = hd;
    const Formula f = sparse_attention_bytes(z, T, 4, 4, GetParam());
    EXPECT_LE(double(peak), f.bytes * kSlack + kSlackBytes) << f.text << " measured " << peak;
    if (std::getenv("DFLASH_VERBOSE"))
      std::cout << "measured/formula " << double(peak) / f.bytes << "\n";
  }
}

TEST_P(MemoryCeiling, SparseAttentionPeakDoesNotGrowWithSAtFixedTile) {
  // Growing S may add the key gradients and their accumulators (O(S*hd) per
  // kv head), never an O(Q*S) score term: nh*Q*4 bytes per key here is 32x
  // what is allowed.
  const int64_t N = 16, nh = 8, nkv = 2, hd = 16, T = 64;
  AttnSetup a = attn_setup(512, N, nh, nkv, hd), b = attn_setup(2048, N, nh, nkv, hd);
  const int64_t pa = attn_peak(a, T, GetParam()), pb = attn_peak(b, T, GetParam());
  const double per_key = 4.0 * nkv * hd * 2 /* dk, dv */ + 4.0 * hd * 2 /* accumulators */;
  EXPECT_LE(double(pb - pa), (2048 - 512) * per_key * kSlack + kSlackBytes)
      << "peaks " << pa << " -> " << pb;
}

// The objectives of docs/LOSSES.md, each alone and all together: the
// teacher-only path (forward KL, JSD at beta = 0), the general path
// (reverse KL, TV, JSD at beta = 1) and the JSD mixture.
struct ObjectiveRow {
  const char* name;
  double kl, reverse_kl, jsd, jsd_beta, tv;
};
constexpr ObjectiveRow kObjectiveRows[] = {
    {"kl", 1, 0, 0, 0.5, 0},          {"reverse_kl", 0, 1, 0, 0.5, 0}, {"jsd", 0, 0, 1, 0.5, 0},
    {"jsd_beta_0", 0, 0, 1, 0, 0},    {"jsd_beta_1", 0, 0, 1, 1, 0},   {"tv", 0, 0, 0, 0.5, 1},
    {"all", 0.3, 0.2, 0.7, 0.3, 0.4},
};

void set_objective(LossConfig& l, const ObjectiveRow& o) {
  l.kl_weight = o.kl, l.reverse_kl_weight = o.reverse_kl, l.jsd_weight = o.jsd;
  l.jsd_beta = o.jsd_beta, l.tv_weight = o.tv;
}

void expect_under(const char* what, const ObjectiveRow& o, int64_t peak, const Formula& f) {
  EXPECT_LE(double(peak), f.bytes * kSlack + kSlackBytes)
      << what << " " << o.name << ": " << f.text << " measured " << peak;
  EXPECT_GE(double(peak), f.bytes * 0.5)
      << what << " " << o.name << ": formula far above measurement: " << f.text;
  if (std::getenv("DFLASH_VERBOSE"))
    std::cout << what << " " << o.name << " measured/formula " << double(peak) / f.bytes << "\n";
}

TEST_P(MemoryCeiling, EveryObjectiveUnderItsFormula) {
  const int64_t Q = 512, H = 64, V = 4096, C = 64;
  LossSizes z;
  z.M = z.Ns = Q, z.H = H, z.V = V, z.C = C;
  for (const ObjectiveRow& o : kObjectiveRows) {
    LossSetup s = loss_setup(Q, H, V, C, true, GetParam());
    set_objective(s.cfg.loss, o);
    const int64_t peak = loss_peak(s);
    expect_under("fused", o, peak, chunked_loss_bytes(z, LossTerms::of(s.cfg.loss), 4, GetParam()));
  }
}

// The planner's what-if rows: the reference's full logits and plain
// autograd per chunk (harness/zoo.h's no_recompute_loss), per objective.
TEST(MemoryCeilingObjectives, UnfusedLossesUnderTheirFormulas) {
  const int64_t Q = 256, H = 64, V = 4096, C = 64;
  for (const ObjectiveRow& o : kObjectiveRows) {
    for (bool chunked : {false, true}) {
      LossSetup s = loss_setup(Q, H, V, C, true, optimized::Kernels::kHost);
      set_objective(s.cfg.loss, o);
      const LossFn fn = chunked ? no_recompute_loss() : LossFn(reference::loss_and_metrics);
      AllocProbe::install();
      int64_t peak = 0;
      {
        AllocProbe::Scope scope;
        fn(s.cfg, s.D, s.Ht, s.W, s.layout, s.anchors).loss.backward();
        peak = scope.peak_delta();
      }
      const LossTerms t = LossTerms::of(s.cfg.loss);
      expect_under(chunked ? "no recompute" : "unchunked", o, peak,
                   chunked ? chunked_no_recompute_loss_bytes(Q, V, C, t, 4)
                           : unchunked_loss_bytes(Q, V, t, 4));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, MemoryCeiling,
                         ::testing::Values(optimized::Kernels::kHost, optimized::Kernels::kAten),
                         [](const auto& i) {
                           return std::string(optimized::kernels_name(i.param));
                         });

TEST(MemoryCeilingStep, CheckpointedLayersKeepOnlyTheirInputs) {
  Config c = fixtures::micro_config();
  c.run.dtype = DType::kFloat32;
  LayerShape layer;  // rope_theta, rms_norm_eps: the defaults (1e6, 1e-6)
  layer.hidden_size = 64, layer.intermediate_size = 256, layer.head_dim = 16;
  layer.num_attention_heads = 4, layer.num_key_value_heads = 2;
  c.target.shape = layer;
  c.drafter.shape = c.target.shape;
  c.drafter.num_hidden_layers = 3;
  c.data = DataConfig::batch("fixture", 2, 64, 4, 8, 31);
  c.optimized.checkpoint_layers = true;
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const DraftLayout l = make_draft_layout(in.input_ids, in.loss_mask, in.anchors, 4, 31, 0.0);
  auto held = [&](bool checkpointed) {
    Config cc = c;
    cc.optimized.checkpoint_layers = checkpointed;
    AllocProbe::install();
    const int64_t before = AllocProbe::live_bytes();
    const at::Tensor D = optimized::drafter_hidden(cc, w, target.frozen(), in, l);
    return AllocProbe::live_bytes() - before;  // what the graph keeps for backward
  };
  const int64_t Q = l.noise_ids.size(1);
  const double f_bytes =
      checkpointed_saved_bytes(3, AttentionSizes::of(c.drafter.shape, 2, Q, 64), 64, 4).bytes +
      context_bytes(2, 64, 64, 4).bytes;
  const Formula f{f_bytes, "checkpointed_saved_bytes + context_bytes"};
  const int64_t ck = held(true), plain = held(false);
  EXPECT_LE(double(ck), f.bytes * kSlack + kSlackBytes) << f.text << " measured " << ck;
  EXPECT_LT(double(ck), 0.5 * double(plain)) << "checkpointed " << ck << " plain " << plain;
  if (std::getenv("DFLASH_VERBOSE"))
    std::cout << "checkpointed " << ck << " formula " << f.bytes << " plain " << plain << "\n";
}

}  // namespace
}  // namespace dflash::harness
