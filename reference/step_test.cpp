// The reference step against the SPEC text: the mask against an independent
// triple loop, keep = false rows, frozen weights, precision agreement.
#include "reference/step.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "fixtures/fixtures.h"
#include "reference/layers.h"
#include "reference/target.h"

namespace dflash::reference {
namespace {

// SPEC step 7, written as the text says, one (row, slot, key) at a time.
at::Tensor triple_loop_mask(const Anchors& a, int64_t S, int64_t bs) {
  const int64_t B = a.anchors.size(0), N = a.num_anchors(), Q = N * bs;
  at::Tensor m = at::zeros({B, Q, S + Q}, at::kBool);
  auto M = m.accessor<bool, 3>();
  auto A = a.anchors.accessor<int64_t, 2>();
  auto K = a.keep.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < bs; ++k)
        for (int64_t j = 0; j < S + Q; ++j) {
          const bool context = j < S && j < A[b][n];
          const bool own_block = j >= S && (j - S) / bs == n;
          M[b][n * bs + k][j] = K[b][n] && (context || own_block);
        }
  return m;
}

struct MaskCase {
  Anchors a;
  int64_t S, bs;
};

rc::Gen<MaskCase> gen_mask_case() {
  return rc::gen::exec([] {
    const int64_t B = *rc::gen::inRange<int64_t>(1, 4), S = *rc::gen::inRange<int64_t>(2, 20);
    const int64_t N = *rc::gen::inRange<int64_t>(0, 5), bs = *rc::gen::inRange<int64_t>(2, 6);
    at::Tensor anchors = at::zeros({B, N}, at::kLong), keep = at::zeros({B, N}, at::kBool);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n) {
        // Anchors anywhere in [0, S-2], the extremes included by the generator's shrinking.
        anchors[b][n] = *rc::gen::inRange<int64_t>(0, S - 1);
        keep[b][n] = *rc::gen::arbitrary<bool>();
      }
    return MaskCase{{anchors, keep}, S, bs};
  });
}

RC_GTEST_PROP(DraftMask, EqualsTripleLoop, ()) {
  const MaskCase c = *gen_mask_case();
  RC_ASSERT(at::equal(build_draft_mask(c.a, c.S, c.bs), triple_loop_mask(c.a, c.S, c.bs)));
}

TEST(DraftMask, FixedCasesEqualTripleLoop) {
  // Row 0: anchors at 0 and S-2 (S = 10); row 1: a keep = false padding
  // entry; row 2: no candidates at all (every entry padding).
  const Anchors a{at::tensor({0, 8, 3, 0, 0, 0}, at::kLong).view({3, 2}),
                  at::tensor({1, 1, 1, 0, 0, 0}, at::kLong).to(at::kBool).view({3, 2})};
  const at::Tensor m = build_draft_mask(a, 10, 4);
  EXPECT_TRUE(at::equal(m, triple_loop_mask(a, 10, 4)));
  // Anchor 0 sees no context; anchor 8 sees context 0..7 but not 8 itself.
  EXPECT_FALSE(m[0][0].narrow(0, 0, 10).any().item<bool>());
  EXPECT_EQ(m[0][4].narrow(0, 0, 10).sum().item<int64_t>(), 8);
  EXPECT_FALSE(m[0][4][8].item<bool>());
  EXPECT_FALSE(m[1].narrow(0, 4, 4).any().item<bool>());
  EXPECT_FALSE(m[2].any().item<bool>());
}

TEST(MaskedAttention, RowsThatSeeNothingOutputExactlyZero) {
  at::manual_seed(0);
  const at::Tensor q = at::randn({2, 4, 6, 8}, at::kDouble).requires_grad_();
  const at::Tensor k = at::randn({2, 2, 9, 8}, at::kDouble).requires_grad_();
  const at::Tensor v = at::randn({2, 2, 9, 8}, at::kDouble).requires_grad_();
  at::Tensor vis = at::rand({2, 6, 9}) > 0.5;
  vis[0][2].fill_(false);
  vis[1].narrow(0, 3, 3).fill_(false);
  const at::Tensor out = masked_attention(q, k, v, vis);
  EXPECT_TRUE(at::equal(out[0].select(1, 2), at::zeros({4, 8}, at::kDouble)));
  EXPECT_TRUE(at::equal(out[1].narrow(1, 3, 3), at::zeros({4, 3, 8}, at::kDouble)));
  (out * at::randn_like(out)).sum().backward();
  for (const at::Tensor& t : {out, q.grad(), k.grad(), v.grad()})
    EXPECT_TRUE(at::isfinite(t).all().item<bool>());
  EXPECT_TRUE(at::equal(q.grad()[0].select(1, 2), at::zeros({4, 8}, at::kDouble)));
}

TEST(MaskedAttention, GqaMapsHeadToKvHeadDiv) {
  // Query head h must read kv head h div (nh / nkv): make kv head 1 distinct.
  const at::Tensor q = at::ones({1, 4, 1, 2}, at::kDouble);
  at::Tensor v = at::zeros({1, 2, 1, 2}, at::kDouble);
  v[0][1].fill_(1.0);
  const at::Tensor out = masked_attention(q, at::zeros_like(v), v, at::ones({1, 1, 1}, at::kBool));
  EXPECT_EQ(out.select(-1, 0).view(-1).sum().item<double>(), 2.0);
  EXPECT_EQ(out[0][2][0][0].item<double>(), 1.0);
  EXPECT_EQ(out[0][1][0][0].item<double>(), 0.0);
}

struct StepSetup {
  Config c;
  TargetWeights target;
  DrafterWeights drafter;
  StepInputs in;
  explicit StepSetup(Config cfg, uint64_t step = 0)
      : c(std::move(cfg)),
        target(make_target(c)),
        drafter(make_drafter(c)),
        in(fixtures::make_step_inputs(c, target, step)) {}
};

// SPEC, "one step" 6-8 for a block that sees nothing (keep = false): its
// attention outputs exactly 0, so each layer adds only its MLP, and every
// slot's student hidden state is that of a lone MASK token, written here
// with plain tensor operations (not the reference's layers).
at::Tensor lone_mask_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f) {
  const double eps = c.drafter.shape.rms_norm_eps;
  auto rms = [eps](const at::Tensor& x, const at::Tensor& g) {
    return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * g;
  };
  at::Tensor x = f.embed_tokens[c.data.mask_token_id].to(at::kDouble);  // (H)
  for (const DecoderLayerWeights& l : w.layers) {
    const at::Tensor h = rms(x, l.post_attention_layernorm.detach());
    x = x + at::matmul(l.down_proj.detach(), at::silu(at::matmul(l.gate_proj.detach(), h)) *
                                                 at::matmul(l.up_proj.detach(), h));
  }
  return rms(x, w.norm.detach());  // (H)
}

TEST(ReferenceStep, KeepFalseRowsGiveZeroHiddenUpdateAndNoNaN) {
  StepSetup s(fixtures::micro_config());
  ASSERT_FALSE(s.in.anchors.keep.all().item<bool>()) << "fixture must have padding";
  const StepResult r = run_step(drafter_step, s.c, s.drafter, s.target.frozen(), s.in);
  EXPECT_TRUE(std::isfinite(r.out.loss.item<double>()));
  EXPECT_TRUE(at::isfinite(r.out.student_hidden).all().item<bool>());
  for (const auto& [name, g] : r.grads) EXPECT_TRUE(at::isfinite(g).all().item<bool>()) << name;
  const at::Tensor lone = lone_mask_hidden(s.c, s.drafter, s.target.frozen());  // (H)
  const int64_t B = s.in.anchors.anchors.size(0), N = s.in.anchors.num_anchors();
  const int64_t bs = s.c.data.block_size;
  int64_t checked = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      if (s.in.anchors.keep[b][n].item<bool>()) continue;
      for (int64_t k = 0; k < bs; ++k, ++checked) {
        const at::Tensor d = r.out.student_hidden[b][n * bs + k];  // (H)
        EXPECT_LT((d - lone).abs().max().item<double>(), 1e-12)
            << "row " << b << " block " << n << " slot " << k
            << ": a keep = false block's hidden state is not a lone MASK token's";
      }
    }
  EXPECT_GT(checked, 0);
}

TEST(ReferenceStep, FrozenWeightsEndWithoutGradient) {
  StepSetup s(fixtures::micro_config());
  const StepResult r = run_step(drafter_step, s.c, s.drafter, s.target.frozen(), s.in);
  EXPECT_GT(r.grad_norm, 0.0);
  visit(s.target, [](const std::string& name, at::Tensor& t) {
    EXPECT_FALSE(t.requires_grad()) << name;
    EXPECT_FALSE(t.grad().defined()) << name;
  });
  for (const auto& [name, g] : r.grads) EXPECT_TRUE(g.defined()) << name;
}

TEST(ReferenceStep, TiedEmbeddingsStayFrozen) {
  Config c = fixtures::micro_config();
  c.target.tie_word_embeddings = true;
  StepSetup s(c);
  ASSERT_TRUE(s.target.lm_head.is_same(s.target.embed_tokens));
  run_step(drafter_step, s.c, s.drafter, s.target.frozen(), s.in);
  EXPECT_FALSE(s.target.embed_tokens.grad().defined());
}

TEST(ReferenceStep, Float32AgreesWithFloat64) {
  Config c64 = fixtures::micro_config();
  Config c32 = c64;
  c32.run.dtype = DType::kFloat32;
  StepSetup s64(c64), s32(c32);
  ASSERT_TRUE(at::equal(s64.in.anchors.anchors, s32.in.anchors.anchors));
  const StepResult r64 = run_step(drafter_step, s64.c, s64.drafter, s64.target.frozen(), s64.in);
  const StepResult r32 = run_step(drafter_step, s32.c, s32.drafter, s32.target.frozen(), s32.in);
  EXPECT_NEAR(r32.out.loss.item<double>(), r64.out.loss.item<double>(), 1e-5);
  for (size_t i = 0; i < r64.grads.size(); ++i) {
    const at::Tensor d = r32.grads[i].second.to(at::kDouble) - r64.grads[i].second;
    EXPECT_LT(d.abs().max().item<double>(),
              1e-4 * (1 + r64.grads[i].second.abs().max().item<double>()))
        << r64.grads[i].first;
  }
}

TEST(ReferenceStep, BatchWithoutAnyCandidateHasZeroLossAndTauOne) {
  StepSetup s(fixtures::micro_config());
  s.in.loss_mask.zero_();
  Rng rng(1);
  s.in.anchors = sample_anchors(s.in.loss_mask, s.c.data.max_anchors, rng);
  ASSERT_EQ(s.in.anchors.num_anchors(), 0);
  const StepResult r = run_step(drafter_step, s.c, s.drafter, s.target.frozen(), s.in);
  EXPECT_EQ(r.out.loss.item<double>(), 0.0);
  EXPECT_EQ(r.out.tau(), 1.0);
  EXPECT_EQ(r.grad_norm, 0.0);
}

TEST(ReferenceStep, MetricsCountOnlyWeightedSlots) {
  // SPEC step 10: slot k of block n counts when w > 0 before decay, i.e.
  // keep_n and anchor_n + k < S and k > 0 and loss_mask[anchor_n + k];
  // written as loops here, not through the layout the step itself uses.
  for (uint64_t step : {0, 1, 2}) {
    StepSetup s(fixtures::micro_config(), step);
    const StepResult r = run_step(drafter_step, s.c, s.drafter, s.target.frozen(), s.in);
    const int64_t B = s.in.input_ids.size(0), S = s.in.input_ids.size(1);
    const int64_t N = s.in.anchors.num_anchors(), bs = s.c.data.block_size;
    auto A = s.in.anchors.anchors.accessor<int64_t, 2>();
    auto K = s.in.anchors.keep.accessor<bool, 2>();
    auto M = s.in.loss_mask.accessor<bool, 2>();
    std::vector<int64_t> counted(bs, 0);
    int64_t kept = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n) {
        kept += K[b][n];
        for (int64_t k = 1; k < bs; ++k)
          counted[k] += K[b][n] && A[b][n] + k < S && M[b][A[b][n] + k];
      }
    for (int64_t k = 0; k < bs; ++k)
      EXPECT_EQ(r.out.counted[k].item<int64_t>(), counted[k]) << "step " << step << " slot " << k;
    EXPECT_EQ(r.out.kept_blocks.item<int64_t>(), kept) << "step " << step;
    EXPECT_EQ(r.out.accuracy()[0].item<double>(), 0.0);
    EXPECT_LE(r.out.accept_sum.item<int64_t>(), kept * (bs - 1));
  }
}

TEST(ReferenceStep, TauCountsLeadingCorrectSlots) {
  // Hand-set predictions through an LM head whose first H rows are the
  // identity, so argmax(logits) = argmax(D). Labels: block 0 -> 1 2 3 4,
  // block 1 -> 5 6 7 8. Block 0 is right at slots 1, 2 and wrong at 3
  // (accepts 2); block 1 is wrong at slot 1 and right after (accepts 0).
  const Config c = fixtures::micro_config();
  const int64_t V = c.target.vocab_size, H = c.target.shape.hidden_size;
  at::Tensor lm = at::zeros({V, H}, at::kDouble);
  lm.narrow(0, 0, H).copy_(at::eye(H, at::kDouble));
  const Anchors a{at::tensor({0, 4}, at::kLong).view({1, 2}), at::ones({1, 2}, at::kBool)};
  const at::Tensor ids = at::arange(1, 11, at::kLong).view({1, 10});
  const DraftLayout l =
      make_draft_layout(ids, at::ones({1, 10}, at::kBool), a, 4, c.data.mask_token_id, 0.0);
  at::Tensor D = at::zeros({1, 8, H}, at::kDouble);
  const std::vector<int64_t> pred = {0, 2, 3, 9, 0, 9, 7, 8};
  for (int64_t q = 0; q < 8; ++q) D[0][q][pred[size_t(q)]] = 1.0;
  const StepOutputs o = loss_and_metrics(c, D, at::zeros({1, 10, H}, at::kDouble), lm, l, a);
  EXPECT_EQ(o.accept_sum.item<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(o.tau(), 2.0);  // 1 + (2 + 0) / 2
  EXPECT_TRUE(at::equal(o.correct, at::tensor({0, 1, 2, 1}, at::kLong)));
}

}  // namespace
}  // namespace dflash::reference
