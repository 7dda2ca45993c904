// AdamW (SPEC.md step 11) against hand-computed values: the warmup + cosine
// schedule, one update with decoupled weight decay, clipping by the global
// norm, parameters without a gradient left alone, and a state round trip.
#include "core/optim.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dflash {
namespace {

at::Tensor leaf(std::vector<double> v) { return at::tensor(v, at::kDouble).requires_grad_(true); }

TEST(Optim, WarmupThenCosineToTheFloor) {
  OptimConfig c;
  c.lr = 1.0, c.warmup_steps = 4, c.total_steps = 14, c.min_lr_ratio = 0.1;
  const at::Tensor p = leaf({1.0});
  AdamW opt({{"p", p}}, c);
  EXPECT_DOUBLE_EQ(opt.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(opt.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(opt.lr_at(4), 1.0);
  EXPECT_NEAR(opt.lr_at(9), 0.1 + 0.9 * 0.5, 1e-15);  // half way: cos(pi/2) = 0
  EXPECT_NEAR(opt.lr_at(14), 0.1, 1e-15);
  EXPECT_NEAR(opt.lr_at(100), 0.1, 1e-15);
}

TEST(Optim, OneUpdateMatchesTheFormula) {
  OptimConfig c;
  c.lr = 0.1, c.beta1 = 0.9, c.beta2 = 0.999, c.eps = 1e-8, c.weight_decay = 0.01;
  c.clip_norm = 0;  // off
  const at::Tensor p = leaf({1.0, 2.0});
  p.mutable_grad() = at::tensor({0.5, -1.0}, at::kDouble);
  AdamW opt({{"p", p}}, c);
  const AdamW::Stats s = opt.step();
  EXPECT_NEAR(s.grad_norm, std::sqrt(1.25), 1e-15);
  // Bias-corrected first step: m_hat = g, v_hat = g^2, update = g / (|g| + eps).
  const double g[2] = {0.5, -1.0}, p0[2] = {1.0, 2.0};
  for (int i = 0; i < 2; ++i) {
    const double want = p0[i] * (1 - 0.1 * 0.01) - 0.1 * g[i] / (std::abs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i].item<double>(), want, 1e-14) << i;
  }
}

TEST(Optim, ClipsByTheGlobalNormAndSkipsParametersWithoutGradient) {
  OptimConfig c;
  c.lr = 0.1, c.clip_norm = 1.0;
  const at::Tensor a = leaf({3.0}), b = leaf({0.0, 0.0}), idle = leaf({7.0});
  a.mutable_grad() = at::tensor({3.0}, at::kDouble);
  b.mutable_grad() = at::tensor({4.0, 0.0}, at::kDouble);  // global norm 5
  AdamW opt({{"a", a}, {"b", b}, {"idle", idle}}, c);
  EXPECT_NEAR(opt.step().grad_norm, 5.0, 1e-15);
  const NamedTensors st = opt.state();
  // exp_avg = (1 - beta1) * g * clip / (norm + 1e-6)
  EXPECT_NEAR(st[0].second.item<double>(), 0.1 * 3.0 * 1.0 / (5.0 + 1e-6), 1e-15);
  EXPECT_EQ(idle.item<double>(), 7.0);
  EXPECT_EQ(st[4].first, "exp_avg.idle");
  EXPECT_EQ(st[4].second.item<double>(), 0.0);
}

TEST(Optim, StateRoundTripContinuesIdentically) {
  OptimConfig c;
  c.lr = 0.05, c.warmup_steps = 2, c.total_steps = 6;
  const at::Tensor p = leaf({1.0, -1.0}), q = leaf({1.0, -1.0});
  AdamW a({{"w", p}}, c), b({{"w", q}}, c);
  auto grad = [](const at::Tensor& t, double k) {
    t.mutable_grad() = at::tensor({k, -2 * k}, at::kDouble);
  };
  grad(p, 1.0), a.step();
  {
    at::NoGradGuard ng;
    q.copy_(p);
  }
  std::map<std::string, at::Tensor> st;
  for (auto& [n, t] : a.state()) st[n] = t.clone();
  b.load_state(st, a.steps_taken(), "test");
  for (double k : {0.5, -3.0}) {
    grad(p, k), grad(q, k);
    a.step(), b.step();
  }
  EXPECT_TRUE(at::equal(p, q));
  EXPECT_THROW(b.load_state({}, 1, "empty"), std::runtime_error);
}

TEST(Optim, ConfigFromTheTrainSection) {
  TrainConfig t;
  t.lr = 2e-3, t.steps = 77, t.warmup_steps = 5, t.min_lr_ratio = 0.2, t.clip_norm = 0.5;
  const OptimConfig o = optim_config(t);
  EXPECT_EQ(o.total_steps, 77);
  EXPECT_EQ(o.warmup_steps, 5);
  EXPECT_DOUBLE_EQ(o.lr, 2e-3);
  EXPECT_DOUBLE_EQ(o.min_lr_ratio, 0.2);
  EXPECT_DOUBLE_EQ(o.clip_norm, 0.5);
  EXPECT_DOUBLE_EQ(o.beta2, 0.95);
}

}  // namespace
}  // namespace dflash
