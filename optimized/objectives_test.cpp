// Every objective and weighting of docs/LOSSES.md through the fused chunked
// loss (both row implementations) against reference::loss_and_metrics:
// float64 tight, float32 and bfloat16 by the error ratio; JSD's endpoints
// are the two KLs and its mixture formula tends to beta * KL(p_t || p_s);
// D-PACE's weights match Model-Optimizer's unit vector; extreme logits
// (log-probabilities far below float32's exp range) stay finite and exact.
#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "harness/parity.h"
#include "harness/tolerance.h"
#include "optimized/chunked_loss.h"
#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::optimized {
namespace {

// One objective or weighting per row: name and the [loss] it sets (on top
// of ce_weight = 0, kl_weight = 0, T = 1.3, chunk 5).
struct Objective {
  const char* name;
  std::function<void(LossConfig&)> set;
};

const Objective kObjectives[] = {
    {"reverse_kl", [](LossConfig& l) { l.reverse_kl_weight = 1.0; }},
    {"jsd_beta_0_3", [](LossConfig& l) { l.jsd_weight = 1.0, l.jsd_beta = 0.3; }},
    {"jsd_beta_0", [](LossConfig& l) { l.jsd_weight = 1.0, l.jsd_beta = 0.0; }},
    {"jsd_beta_1", [](LossConfig& l) { l.jsd_weight = 1.0, l.jsd_beta = 1.0; }},
    {"tv", [](LossConfig& l) { l.tv_weight = 1.0; }},
    {"ce_plus_every_term",
     [](LossConfig& l) {
       l.ce_weight = 0.5, l.kl_weight = 0.2, l.reverse_kl_weight = 0.3, l.jsd_weight = 0.4,
       l.tv_weight = 0.6;
     }},
    {"ce_dpace", [](LossConfig& l) { l.ce_weight = 1.0, l.weighting = Weighting::kDpace; }},
    {"kl_tv_dpace_alpha_0_3",
     [](LossConfig& l) {
       l.kl_weight = 1.0, l.tv_weight = 0.5, l.weighting = Weighting::kDpace;
       l.dpace_alpha = 0.3;
     }},
    {"ce_uniform", [](LossConfig& l) { l.ce_weight = 1.0, l.weighting = Weighting::kUniform; }},
};

struct Inputs {
  Config c;
  at::Tensor D, Ht, W;  // float64 originals
  DraftLayout layout;
  Anchors anchors;
};

Inputs make_inputs(const Objective& o, uint64_t seed, double logit_scale = 0.7) {
  at::manual_seed(int64_t(seed));
  const int64_t B = 2, S = 20, bs = 4, N = 4, H = 12, V = 37;
  Inputs in;
  in.c = fixtures::micro_config();
  in.c.loss = LossConfig{};
  in.c.loss.ce_weight = 0.0, in.c.loss.temperature = 1.3, in.c.loss.chunk_size = 5;
  o.set(in.c.loss);
  in.c.data.block_size = bs;
  const at::Tensor mask = at::rand({B, S}) > 0.15;
  Rng rng(seed);
  in.anchors = sample_anchors(mask, N, rng);
  const at::Tensor ids = at::randint(V, {B, S}, at::kLong);
  in.layout = make_draft_layout(ids, mask, in.anchors, bs, V - 1, in.c.loss.gamma);
  const int64_t Q = in.layout.noise_ids.size(1);
  in.D = at::randn({B, Q, H}, at::kDouble);
  in.Ht = at::randn({B, S, H}, at::kDouble);
  in.W = at::randn({V, H}, at::kDouble) * logit_scale;
  return in;
}

struct LossRun {
  StepOutputs out;
  at::Tensor grad;  // dD of (upstream * loss)
};

using LossFnPtr = decltype(&reference::loss_and_metrics);

LossRun run(LossFnPtr fn, const Inputs& in, at::ScalarType dt, Kernels k = Kernels::kHost) {
  Config c = in.c;
  c.optimized.kernels = kernels_name(k);
  const at::Tensor leaf = in.D.detach().to(dt).clone().requires_grad_(true);
  LossRun r;
  r.out = fn(c, leaf * 1.0, in.Ht.to(dt), in.W.to(dt), in.layout, in.anchors);
  (r.out.loss * -0.83).backward();
  r.grad = leaf.grad();
  return r;
}

harness::NamedOutputs outputs(const LossRun& r) {
  harness::NamedOutputs o = harness::loss_terms(r.out);
  o.emplace_back("weight_sum", r.out.weight_sum);
  o.emplace_back("grad.student_hidden", r.grad);
  return o;
}

harness::ComparisonReport compare(const LossRun& cand, const LossRun& same, const LossRun& r64,
                                  const harness::Tolerance& t) {
  return harness::compare_outputs(outputs(cand), outputs(same), outputs(r64), t);
}

class Objectives : public ::testing::TestWithParam<std::tuple<Objective, Kernels>> {
 protected:
  const Objective& obj() const { return std::get<0>(GetParam()); }
  Kernels kernels() const { return std::get<1>(GetParam()); }
};

TEST_P(Objectives, Float64MatchesTheReference) {
  const Inputs in = make_inputs(obj(), 21);
  const LossRun ref = run(reference::loss_and_metrics, in, at::kDouble);
  const LossRun opt = run(loss_and_metrics, in, at::kDouble, kernels());
  // Both float64: summation order only.
  const auto rep = compare(opt, ref, ref, {1.0, 1e-11});
  EXPECT_TRUE(rep.ok()) << rep.format();
  EXPECT_GT(ref.grad.abs().max().item<double>(), 0.0);  // the case has a gradient to compare
}

TEST_P(Objectives, Float32WithinTheErrorRatio) {
  const Inputs in = make_inputs(obj(), 22);
  const LossRun r64 = run(reference::loss_and_metrics, in, at::kDouble);
  const LossRun r32 = run(reference::loss_and_metrics, in, at::kFloat);
  const LossRun opt = run(loss_and_metrics, in, at::kFloat, kernels());
  // As the CE + KL cases (chunked_loss_test.cpp): 4x the fp32 reference's
  // error plus 4 ulps of the scale.
  const auto rep = compare(opt, r32, r64, {4.0, 0x1p-21});
  EXPECT_TRUE(rep.ok()) << rep.format();
}

TEST_P(Objectives, ExtremeLogitsStayFiniteAndAccurate) {
  // Logits of +-400 at T = 1.3: most log-probabilities lie far below -104,
  // where float32's exp is 0 (and JSD's mixture, unshifted, log(0) = -inf).
  const Inputs in = make_inputs(obj(), 23, 60.0);
  const LossRun r64 = run(reference::loss_and_metrics, in, at::kDouble);
  const LossRun r32 = run(reference::loss_and_metrics, in, at::kFloat);
  const LossRun opt = run(loss_and_metrics, in, at::kFloat, kernels());
  ASSERT_TRUE(at::isfinite(opt.grad).all().item<bool>());
  ASSERT_TRUE(std::isfinite(opt.out.loss.item<double>()));
  // The parity rule's float32 tolerance (harness/parity.cpp), 4x + 5e-5 of
  // the scale, and an absolute floor of 1e-5: where a bounded term saturates
  // (JSD, TV of nearly disjoint rows) its gradient's scale is ~0, and rows
  // where student and teacher agree on one token cancel (p_s - p_t, log p_s
  // - log m) to ~1e-7 per logit, times |W| ~ 60 in the hidden gradient.
  const auto rep = compare(opt, r32, r64, {4.0, 5e-5, 1e-5});
  EXPECT_TRUE(rep.ok()) << rep.format();
}

INSTANTIATE_TEST_SUITE_P(Rows, Objectives,
                         ::testing::Combine(::testing::ValuesIn(kObjectives),
                                            ::testing::Values(Kernels::kHost, Kernels::kAten)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param).name) + "_" +
                                  kernels_name(std::get<1>(i.param));
                         });

// jsd_beta = 0 is the forward KL and 1 the reverse KL (TRL's convention):
// the same loss, reported value and gradient as those objectives, in every
// build.
TEST(JsdEndpoints, AreTheTwoKls) {
  for (const auto& [beta, kl_side] : {std::pair<double, bool>{0.0, true}, {1.0, false}}) {
    const Objective jsd{"jsd",
                        [beta = beta](LossConfig& l) { l.jsd_weight = 0.7, l.jsd_beta = beta; }};
    const Objective kl{"kl", [kl_side = kl_side](LossConfig& l) {
                         (kl_side ? l.kl_weight : l.reverse_kl_weight) = 0.7;
                       }};
    const Inputs a = make_inputs(jsd, 31), b = make_inputs(kl, 31);
    for (int build = 0; build < 3; ++build) {
      const LossFnPtr fn = build == 0 ? reference::loss_and_metrics : loss_and_metrics;
      const Kernels k = build == 2 ? Kernels::kAten : Kernels::kHost;
      const LossRun x = run(fn, a, at::kDouble, k), y = run(fn, b, at::kDouble, k);
      const at::Tensor yv = kl_side ? y.out.kl : y.out.reverse_kl;
      EXPECT_NEAR(x.out.jsd.item<double>(), yv.item<double>(), 1e-12) << beta << " " << build;
      EXPECT_NEAR(x.out.loss.item<double>(), y.out.loss.item<double>(), 1e-12);
      EXPECT_TRUE(at::allclose(x.grad, y.grad, 1e-10, 1e-12)) << beta << " " << build;
    }
  }
}

// Away from the endpoints the mixture formula itself: JSD_beta / beta tends
// to KL(p_t || p_s) as beta -> 0 and JSD_beta / (1 - beta) to KL(p_s || p_t)
// as beta -> 1 (the special cases are the limits of the rescaled formula).
TEST(JsdEndpoints, MixtureFormulaApproachesThemAsymptotically) {
  const Objective both{"both", [](LossConfig& l) { l.kl_weight = 1.0, l.reverse_kl_weight = 1.0; }};
  const LossRun kls = run(loss_and_metrics, make_inputs(both, 32), at::kDouble);
  // The first-order remainder is O(beta) times a chi-square-like sum (here
  // about 40x the KL): 1e-3 and 1e-4 are both in the asymptotic regime.
  for (const double eps : {1e-3, 1e-4}) {
    for (const bool near0 : {true, false}) {
      const Objective j{
          "jsd", [&](LossConfig& l) { l.jsd_weight = 1.0, l.jsd_beta = near0 ? eps : 1 - eps; }};
      for (Kernels k : {Kernels::kHost, Kernels::kAten}) {
        const LossRun x = run(loss_and_metrics, make_inputs(j, 32), at::kDouble, k);
        const double scaled = x.out.jsd.item<double>() / eps;
        const double limit = (near0 ? kls.out.kl : kls.out.reverse_kl).item<double>();
        EXPECT_NEAR(scaled, limit, 100 * eps * limit) << eps << " " << near0;
      }
      const LossRun r = run(reference::loss_and_metrics, make_inputs(j, 32), at::kDouble);
      EXPECT_NEAR(r.out.jsd.item<double>() / eps,
                  (near0 ? kls.out.kl : kls.out.reverse_kl).item<double>(),
                  100 * eps * (near0 ? kls.out.kl : kls.out.reverse_kl).item<double>());
    }
  }
}

// Model-Optimizer's D-PACE unit vector: confidences [0.8, 0.5], alpha = 0.5
// -> smoothed [0.9, 0.75], cumulative [0.9, 0.675], weights [1.575, 0.675];
// an uncounted slot is a factor 1 in the product and gets weight 0.
TEST(Dpace, MatchesModelOptimizersVector) {
  const at::Tensor conf = at::tensor({0.8, 0.5, 0.3, 0.6}, at::kDouble);
  const at::Tensor ce = -conf.log().view({1, 4});  // one block of 4: slot 0, 1, 2, 3
  const at::Tensor counted = at::tensor({0, 1, 0, 1}).to(at::kBool).view({1, 4});
  // counted slots 1 and 3 hold 0.5 and 0.6: smoothed 0.75 and 0.8, C = 0.75, 0.6.
  const at::Tensor want = at::tensor({0.0, 1.35, 0.0, 0.6}, at::kDouble).view({1, 4});
  const at::Tensor ref = reference::dpace_weights(ce, counted, 4, 0.5);
  EXPECT_TRUE(at::allclose(ref, want, 0, 1e-15)) << ref;
  const at::Tensor rows = at::tensor({int64_t(1), int64_t(3)});
  const at::Tensor opt = dpace_row_weights(ce.view(-1).index_select(0, rows), rows, 4, 4, 0.5);
  EXPECT_TRUE(at::allclose(opt, at::tensor({1.35, 0.6}, at::kDouble), 0, 1e-15)) << opt;

  const at::Tensor ce2 = -at::tensor({0.9, 0.8, 0.5}, at::kDouble).log().view({1, 3});
  const at::Tensor all = at::tensor({0, 1, 1}).to(at::kBool).view({1, 3});
  const at::Tensor w2 = reference::dpace_weights(ce2, all, 3, 0.5);
  EXPECT_TRUE(at::allclose(w2, at::tensor({0.0, 1.575, 0.675}, at::kDouble).view({1, 3}), 0, 1e-15))
      << w2;
}

// The weights are detached: the loss's gradient is sum_k w_k dCE_k / sum w
// with w held fixed, not differentiated through the confidences.
TEST(Dpace, WeightsCarryNoGradient) {
  const Objective o{"ce_dpace",
                    [](LossConfig& l) { l.ce_weight = 1.0, l.weighting = Weighting::kDpace; }};
  const Inputs in = make_inputs(o, 41);
  const LossRun dp = run(reference::loss_and_metrics, in, at::kDouble);
  // The same loss with the D-PACE weights frozen into the layout.
  Inputs fixed = in;
  const at::Tensor logits = reference::project(in.D, in.W);
  const at::Tensor ce =
      logits.logsumexp(-1) - logits.gather(-1, in.layout.labels.unsqueeze(-1)).squeeze(-1);
  fixed.layout.weights =
      in.layout.weights * reference::dpace_weights(ce, in.layout.counted, 4, 0.5);
  fixed.c.loss.weighting = Weighting::kUniform;
  const LossRun frozen = run(reference::loss_and_metrics, fixed, at::kDouble);
  EXPECT_TRUE(at::allclose(dp.grad, frozen.grad, 1e-12, 1e-14));
  EXPECT_NEAR(dp.out.loss.item<double>(), frozen.out.loss.item<double>(), 1e-12);
  for (Kernels k : {Kernels::kHost, Kernels::kAten}) {
    const LossRun opt = run(loss_and_metrics, in, at::kDouble, k);
    EXPECT_TRUE(at::allclose(opt.grad, frozen.grad, 1e-10, 1e-12)) << kernels_name(k);
  }
  EXPECT_NEAR(dp.out.weight_sum.item<double>(), frozen.out.weight_sum.item<double>(), 1e-12);
}

}  // namespace
}  // namespace dflash::optimized
