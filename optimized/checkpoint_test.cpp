// Checkpointing: the same gradients as no checkpoint (random upstream
// gradient), the RNG replayed, and a loud error for every contract breach.
#include "optimized/checkpoint.h"

#include <gtest/gtest.h>

#include "fixtures/test_support.h"

namespace dflash::optimized {
namespace {

using testing_support::error_of;

struct Region {
  at::Tensor w1, w2;  // parameters (leaves)
  at::Tensor fwd(const at::Tensor& x, const at::Tensor& ctx, bool noise) const {
    at::Tensor h = at::tanh(at::matmul(x, w1)) + ctx;
    if (noise) h = h * (at::rand_like(h) > 0.3);  // dropout-like: needs the same RNG in recompute
    return at::matmul(h * h, w2);
  }
};

Region make_region() {
  at::manual_seed(3);
  return {at::randn({6, 6}, at::kDouble).requires_grad_(),
          at::randn({6, 4}, at::kDouble).requires_grad_()};
}

std::vector<at::Tensor> grads_of(bool use_checkpoint, bool noise, const Region& r) {
  at::manual_seed(11);
  const at::Tensor x0 = at::randn({5, 6}, at::kDouble).requires_grad_();
  const at::Tensor c0 = at::randn({5, 6}, at::kDouble).requires_grad_();
  const at::Tensor x = x0 * 2, ctx = c0 * 1.5;  // activations with history
  const at::Tensor upstream = at::randn({5, 4}, at::kDouble);
  at::Tensor out;
  if (use_checkpoint) {
    out = checkpoint({"region", {{"x", x}, {"ctx", ctx}}, {}, {{"w1", r.w1}, {"w2", r.w2}}},
                     [&](const std::vector<at::Tensor>& g, const std::vector<at::Tensor>&) {
                       return r.fwd(g[0], g[1], noise);
                     });
  } else {
    out = r.fwd(x, ctx, noise);
  }
  r.w1.mutable_grad().reset();
  r.w2.mutable_grad().reset();
  (out * upstream).sum().backward();
  return {x0.grad(), c0.grad(), r.w1.grad(), r.w2.grad()};
}

TEST(Checkpoint, SameGradientsAsWithout) {
  const Region r = make_region();
  const auto a = grads_of(false, false, r), b = grads_of(true, false, r);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::allclose(a[i], b[i], 0, 1e-14)) << i;
}

TEST(Checkpoint, RngStateIsReplayedInRecompute) {
  const Region r = make_region();
  const auto a = grads_of(false, true, r), b = grads_of(true, true, r);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::allclose(a[i], b[i], 0, 1e-14)) << i;
}

auto body(const Region& r) {
  return [&r](const std::vector<at::Tensor>& g, const std::vector<at::Tensor>&) {
    return r.fwd(g[0], g[0], false);
  };
}

TEST(Checkpoint, ThrowsOnInputWithoutGrad) {
  const Region r = make_region();
  const at::Tensor x = at::randn({5, 6}, at::kDouble);  // does not require grad
  const std::string msg = error_of([&] {
    checkpoint({"layers.1", {{"hidden", x}}, {}, {{"w1", r.w1}, {"w2", r.w2}}}, body(r));
  });
  EXPECT_NE(msg.find("layers.1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'hidden'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
}

TEST(Checkpoint, ThrowsOnDetachedActivation) {
  const Region r = make_region();
  const at::Tensor x =
      (at::randn({5, 6}, at::kDouble).requires_grad_() * 2).detach().requires_grad_();
  const std::string msg = error_of([&] {
    checkpoint({"layers.0", {{"hidden", x}}, {}, {{"w1", r.w1}, {"w2", r.w2}}}, body(r));
  });
  EXPECT_NE(msg.find("detached"), std::string::npos) << msg;
  // The same tensor declared as a leaf input is accepted.
  EXPECT_EQ(error_of([&] {
              checkpoint({"layers.0", {{"hidden", x, false}}, {}, {{"w1", r.w1}, {"w2", r.w2}}},
                         body(r))
                  .sum()
                  .backward();
            }),
            "(no error)");
}

TEST(Checkpoint, ThrowsOnParameterWithoutGrad) {
  Region r = make_region();
  r.w2 = r.w2.detach();
  const at::Tensor x = at::randn({5, 6}, at::kDouble).requires_grad_() * 1.0;
  const std::string msg = error_of([&] {
    checkpoint({"layers.2", {{"hidden", x}}, {}, {{"w1", r.w1}, {"mlp.w2", r.w2}}}, body(r));
  });
  EXPECT_NE(msg.find("'mlp.w2'"), std::string::npos) << msg;
}

TEST(Checkpoint, ThrowsOnNonDifferentiableInputThatRequiresGrad) {
  const Region r = make_region();
  const at::Tensor x = at::randn({5, 6}, at::kDouble).requires_grad_() * 1.0;
  const at::Tensor embed = at::randn({5, 6}, at::kDouble).requires_grad_();
  const std::string msg = error_of([&] {
    checkpoint({"layers.0",
                {{"hidden", x}},
                {{"x (frozen embeddings)", embed}},
                {{"w1", r.w1}, {"w2", r.w2}}},
               body(r));
  });
  EXPECT_NE(msg.find("declared non-differentiable"), std::string::npos) << msg;
}

TEST(Checkpoint, ThrowsInBackwardOnUnnamedTrainableTensor) {
  const Region r = make_region();
  const at::Tensor x = at::randn({5, 6}, at::kDouble).requires_grad_() * 1.0;
  const at::Tensor out = checkpoint({"layers.3", {{"hidden", x}}, {}, {{"w1", r.w1}}}, body(r));
  const std::string msg = error_of([&] { out.sum().backward(); });
  EXPECT_NE(msg.find("layers.3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not name"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(6, 4)"), std::string::npos) << msg;  // w2's shape
}

TEST(Checkpoint, ThrowsInBackwardOnUnusedNamedParameter) {
  const Region r = make_region();
  const at::Tensor extra = at::randn({3}, at::kDouble).requires_grad_();
  const at::Tensor x = at::randn({5, 6}, at::kDouble).requires_grad_() * 1.0;
  const at::Tensor out = checkpoint(
      {"layers.4", {{"hidden", x}}, {}, {{"w1", r.w1}, {"w2", r.w2}, {"unused", extra}}}, body(r));
  const std::string msg = error_of([&] { out.sum().backward(); });
  EXPECT_NE(msg.find("'unused' received no gradient"), std::string::npos) << msg;
}

TEST(Checkpoint, NoGradRunsPlainForward) {
  // Under no-grad (evaluation) the region is the plain forward: the same
  // values, the same random draws (dropout-like noise), the generator left
  // where the plain forward leaves it, and no history.
  const Region r = make_region();
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({5, 6}, at::kDouble);  // would breach the contract with grad on
  const at::Tensor ctx = at::randn({5, 6}, at::kDouble);
  at::manual_seed(5);
  const at::Tensor plain = r.fwd(x, ctx, true);
  const at::Tensor plain_next = at::rand({3}, at::kDouble);
  at::manual_seed(5);
  const at::Tensor out =
      checkpoint({"eval", {{"hidden", x}, {"ctx", ctx}}, {}, {{"w1", r.w1}, {"w2", r.w2}}},
                 [&r](const std::vector<at::Tensor>& g, const std::vector<at::Tensor>&) {
                   return r.fwd(g[0], g[1], true);
                 });
  const at::Tensor next = at::rand({3}, at::kDouble);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_FALSE(out.grad_fn());
  EXPECT_TRUE(at::equal(out, plain)) << (out - plain).abs().max().item<double>();
  EXPECT_TRUE(at::equal(next, plain_next))
      << "the generator is not where the plain forward left it";
}

}  // namespace
}  // namespace dflash::optimized
