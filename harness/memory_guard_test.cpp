// The memory guard: the planner's estimate against what is offered, before
// anything is allocated (issue 14). The CLI side (every command refusing a
// config too big for this host, fast and small) is cli.hostile_configs.
#include "harness/memory_guard.h"

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/device.h"
#include "fixtures/fixtures.h"
#include "harness/planner.h"

namespace dflash::harness {
namespace {

// A 55B-parameter fixture model: valid, and no test machine holds it.
Config big_config() {
  Config c = fixtures::micro_config();
  c.path = "big.toml";
  c.target.vocab_size = 262144;
  c.target.num_hidden_layers = 64;
  LayerShape layer;  // rope_theta, rms_norm_eps: the defaults (1e6, 1e-6)
  layer.hidden_size = 8192, layer.intermediate_size = 28672, layer.head_dim = 128;
  layer.num_attention_heads = 64, layer.num_key_value_heads = 8;
  c.target.shape = layer;
  c.drafter.shape = c.target.shape;
  c.data.mask_token_id = c.target.vocab_size - 1;
  validate_config(c);
  return c;
}

TEST(MemoryGuard, BudgetIsThePlannersPeakAgainstCapacityMinusReserve) {
  const Config c = fixtures::micro_config();
  Config local = c;
  local.topology = TopologyConfig{};
  const double peak =
      plan_memory(local, configured_variant(local), TargetAttention::kDense).ranks[0].peak;
  const double reserve = c.topology.memory_reserve_gb * 1e9;
  const MemoryBudget fits = memory_budget(c, Workload::kStep, Where{}, reserve + peak * 1.01);
  EXPECT_TRUE(fits.fits) << fits.text;
  EXPECT_DOUBLE_EQ(fits.need, peak);
  EXPECT_NEAR(fits.have, peak * 1.01, 1.0);
  EXPECT_FALSE(memory_budget(c, Workload::kStep, Where{}, reserve + peak * 0.99).fits);
}

TEST(MemoryGuard, ReferenceStepNeedsMoreThanTheOptimizedAndFeaturesLess) {
  const Config c = big_config();
  const double opt = memory_budget(c, Workload::kStep, Where{}, 1e15).need;
  const double ref = memory_budget(c, Workload::kReferenceStep, Where{}, 1e15).need;
  const double feat = memory_budget(c, Workload::kFeatures, Where{}, 1e15).need;
  EXPECT_GT(opt, 100e9);  // 55B parameters in fp32 alone are 220 GB
  EXPECT_GT(ref, opt);    // full logits and dense attention
  EXPECT_LT(feat, opt);   // the target forward alone
  const MemoryBudget b = memory_budget(c, Workload::kStep, Where{}, 24e9);
  EXPECT_FALSE(b.fits);
  EXPECT_NE(b.text.find("needs an estimated"), std::string::npos) << b.text;
  EXPECT_NE(b.text.find("one optimized step ("), std::string::npos) << b.text;
  EXPECT_NE(b.text.find("GB target weights + "), std::string::npos) << b.text;
}

// Under `dflash launch` on a CPU host every rank allocates from the same
// memory: the training budget is the sum of the ranks' plans, not the largest.
TEST(MemoryGuard, CpuSplitTrainingIsHeldToTheSumOfItsRanks) {
  const std::string root =
      std::getenv("DFLASH_SOURCE_DIR") ? std::getenv("DFLASH_SOURCE_DIR") : ".";
  const Config c = load_config(root + "/fixtures/configs/dist-1x2.toml");
  ASSERT_EQ(c.topology.device, "cpu");
  const Plan p = plan_memory(c, configured_variant(c), TargetAttention::kQueryChunked);
  double sum = 0;
  for (const RankPlan& r : p.ranks) sum += r.peak;
  EXPECT_DOUBLE_EQ(memory_budget(c, Workload::kTrain, Where{}, 1e15).need, sum);
}

TEST(MemoryGuard, RefusesWithTheFiguresUnlessIgnored) {
  const Config c = big_config();  // topology.device = "cpu": held to this host
  try {
    guard_memory(c, Workload::kStep, "dflash step");
    FAIL() << "a 55B model was allowed onto this host";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("dflash step: big.toml: does not fit: needs an estimated one optimized "
                       "step ("),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("one process (target+drafter) on cpu: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("(this host, MemAvailable)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--ignore-memory-plan"), std::string::npos) << msg;
  }
  set_ignore_memory_plan(true);
  EXPECT_NO_THROW(guard_memory(c, Workload::kStep, "dflash step"));
  set_ignore_memory_plan(false);
}

// A CUDA config is held to its configured device size where a CUDA device
// is usable; on a host without one the guard counts and names this host
// (cpu), never a device that is not there (issue 36).
TEST(MemoryGuard, NamesTheDeviceTheConfigRunsOn) {
  Config c = big_config();
  c.topology.device = "cuda";
  c.topology.device_memory_gb = {80.0};
  const MemoryBudget b = memory_budget(c, Workload::kStep, configured_where(c), 80e9);
  EXPECT_FALSE(b.fits);
  EXPECT_NE(b.text.find("one process (target+drafter) on cuda: "), std::string::npos) << b.text;
  EXPECT_NE(b.text.find("offered 78.00 GB (80.00 GB minus topology.memory_reserve_gb 2.00 GB)"),
            std::string::npos)
      << b.text;
  EXPECT_TRUE(memory_budget(c, Workload::kStep, configured_where(c), 1000e9).fits);
  const bool has_cuda = cuda_unavailable().empty();
  EXPECT_EQ(where_it_runs(c).device, has_cuda ? "cuda" : "cpu");
  if (has_cuda) return;
  try {
    guard_memory(c, Workload::kStep, "dflash step");
    FAIL() << "a 55B model was allowed onto this host";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("on cpu (topology.device = \"cuda\", but "), std::string::npos) << msg;
    EXPECT_NE(msg.find("(this host, MemAvailable)"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("topology.device_memory_gb)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace dflash::harness
