// Finite-difference check of the whole reference step in float64: what makes
// the reference trustworthy. Plus the bug zoo for the checker itself: a
// gradient cut from the graph and a wrong custom backward must both fail.
#include "harness/gradcheck.h"

#include <gtest/gtest.h>

#include "fixtures/fixtures.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

struct GradcheckCase {
  const char* name;
  std::function<void(Config&)> change;
};

// Each row moves the micro config to a corner of the step that has its own
// gradient path. Tolerance: relative error < 1e-6 (issue 2); the 4th-order
// difference with h = 1e-3 in float64 reaches ~1e-9 on these sizes.
const GradcheckCase kCases[] = {
    {"default_ce_kl_decay_gqa", [](Config&) {}},
    {"ce_only_no_decay",
     [](Config& c) {
       c.loss.kl_weight = 0;
       c.loss.gamma = 0;
     }},
    {"kl_only_hot_temperature",
     [](Config& c) {
       c.loss.ce_weight = 0;
       c.loss.temperature = 0.7;
     }},
    {"mha_one_layer_one_tap",
     [](Config& c) {
       c.drafter.num_hidden_layers = 1;
       c.drafter.shape.num_key_value_heads = 4;
       c.drafter.target_layer_ids = {2};
     }},
    {"long_blocks_few_anchors",
     [](Config& c) {
       c.data.block_size = 5;
       c.data.max_anchors = 2;
     }},
    {"tied_embeddings_batch_of_one",
     [](Config& c) {
       c.target.tie_word_embeddings = true;
       c.data.batch_size = 1;
     }},
    // The objectives of docs/LOSSES.md, each alone so its own gradient
    // path is what the difference sees (plus CE where it shares a row).
    {"reverse_kl_only",
     [](Config& c) {
       c.loss.ce_weight = 0, c.loss.kl_weight = 0, c.loss.reverse_kl_weight = 1;
       c.loss.temperature = 1.3;
     }},
    {"jsd_beta_0_3_with_ce",
     [](Config& c) { c.loss.kl_weight = 0, c.loss.jsd_weight = 1, c.loss.jsd_beta = 0.3; }},
    {"tv_only_uniform",
     [](Config& c) {
       c.loss.ce_weight = 0, c.loss.kl_weight = 0, c.loss.tv_weight = 1;
       c.loss.gamma = 0, c.loss.weighting = Weighting::kUniform;
     }},
    {"all_objectives_mixed",
     [](Config& c) {
       c.loss.ce_weight = 0.5, c.loss.kl_weight = 0.3, c.loss.reverse_kl_weight = 0.2;
       c.loss.jsd_weight = 0.7, c.loss.jsd_beta = 0.8, c.loss.tv_weight = 0.4;
     }},
    // D-PACE's weights are detached, so a finite difference (which moves
    // them) would not match for alpha < 1; at alpha = 1 they are constant
    // (C_k = 1, w_k = counted slots from k on) and the weighted path is
    // checked exactly. That the weights carry no gradient for alpha < 1 is
    // Dpace.WeightsCarryNoGradient (optimized/objectives_test.cpp).
    {"dpace_alpha_1_kl",
     [](Config& c) {
       c.loss.gamma = 0, c.loss.weighting = Weighting::kDpace, c.loss.dpace_alpha = 1;
     }},
};

class ReferenceGradcheck : public ::testing::TestWithParam<GradcheckCase> {};

TEST_P(ReferenceGradcheck, MatchesFiniteDifferences) {
  Config c = fixtures::micro_config();
  GetParam().change(c);
  validate_config(c);
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 1);
  auto loss = [&] { return reference::drafter_step(c, w, target.frozen(), in).loss; };
  const GradcheckReport rep = gradcheck(loss, named(w), {8, 1e-3, 1e-6, 1e-3, 5});
  EXPECT_TRUE(rep.ok) << GetParam().name << "\n" << rep.format();
  if (std::getenv("DFLASH_VERBOSE")) std::cout << rep.format();
  EXPECT_EQ(rep.worst.size(), named(w).size());
}

INSTANTIATE_TEST_SUITE_P(Configs, ReferenceGradcheck, ::testing::ValuesIn(kCases),
                         [](const auto& i) { return std::string(i.param.name); });

// Bug zoo: a parameter silently cut from the graph (what a detached
// checkpoint input does) leaves its analytic gradient at zero.
TEST(GradcheckZoo, DetachedParameterFails) {
  const Config c = fixtures::micro_config();
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 1);
  auto loss = [&] {
    DrafterWeights cut = w;
    cut.fc = w.fc.detach();  // the mutant
    return reference::drafter_step(c, cut, target.frozen(), in).loss;
  };
  const GradcheckReport rep = gradcheck(loss, named(w), {4, 1e-3, 1e-6, 1e-3, 5});
  EXPECT_FALSE(rep.ok) << rep.format();
}

// Bug zoo: a custom backward scaled by grad_output[0] instead of the
// per-element upstream gradient (invisible when that gradient is all ones).
struct ScaleByFirst : public torch::autograd::Function<ScaleByFirst> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {2 * x * g[0].reshape(-1)[0]};  // the mutant: should be 2 * x * g[0]
  }
};

TEST(GradcheckZoo, GradOutputScalarBugFails) {
  const at::Tensor x = at::linspace(0.5, 1.5, 6, at::kDouble).requires_grad_();
  const at::Tensor weights = at::linspace(1.0, 3.0, 6, at::kDouble);
  auto loss = [&] { return (ScaleByFirst::apply(x) * weights).sum(); };
  EXPECT_FALSE(gradcheck(loss, {{"x", x}}).ok);
  auto ones_upstream = [&] { return ScaleByFirst::apply(x).sum(); };
  EXPECT_TRUE(gradcheck(ones_upstream, {{"x", x}}).ok);  // why upstream must not be all ones
}

}  // namespace
}  // namespace dflash::harness
