// The planner: hand-computed cases, and the seed configuration's SPEC.md
// figures and verdicts.
#include "harness/planner.h"

#include <gtest/gtest.h>

#include "harness/memory.h"

namespace dflash::harness {
namespace {

Config seed() {
  const char* root = std::getenv("DFLASH_SOURCE_DIR");
  return load_config(std::string(root ? root : ".") + "/fixtures/configs/seed-8gpu.toml");
}

double figure(const Config& c, const std::string& name) {
  for (const auto& f : spec_figures(c))
    if (f.name == name) return f.bytes;
  ADD_FAILURE() << "no figure " << name;
  return 0;
}

TEST(Planner, SeedReproducesSpecFigures) {
  const Config c = seed();
  EXPECT_NEAR(figure(c, "one loss chunk of logits") / 1e9, 1.0, 0.05);  // "about 1 GB"
  EXPECT_NEAR(figure(c, "unchunked fp32 logits") / 1e9, 32.5, 0.05);    // 32.5 GB
  EXPECT_NEAR(figure(c, "dense attention scores (fp32, one copy)") / 1e9, 343.6, 0.05);  // 343.6 GB
  EXPECT_NEAR(figure(c, "dense attention scores (fp32, one copy)") / (1 << 30), 320.0,
              0.05);                                                             // 320 GiB
  EXPECT_GT(figure(c, "every chunk's logits kept (no recompute)") / 1e9, 16.0);  // "over 16 GB"
}

// dflash train, features and served decoding run optimized::target_forward,
// whose causal attention takes optimized.target_query_chunk query rows at a
// time: their estimate counts (B, nh, chunk, S) scores, not (B, nh, S, S);
// the fixture steps (reference::target_forward) stay dense.
TEST(Planner, TrainCountsTheQueryChunkedTargetForward) {
  Config c = seed();  // S = 49152, target_query_chunk = 1024
  ASSERT_EQ(c.optimized.target_query_chunk, 1024);
  const PlanItem chunked = target_items(c, TargetAttention::kQueryChunked)[1];
  const PlanItem dense = target_items(c, TargetAttention::kDense)[1];
  EXPECT_NE(chunked.name.find("query-chunked attention, 1024 rows"), std::string::npos)
      << chunked.name;
  EXPECT_LT(chunked.bytes, dense.bytes / 16) << "S / chunk = 48";
  EXPECT_GT(chunked.bytes, target_items(c, TargetAttention::kTiled)[1].bytes);
  const std::string train = workload_label(c, Workload::kTrain);
  EXPECT_NE(train.find("query-chunked target attention"), std::string::npos) << train;
  // and estimate_memory counts it so: rank 0 (a target rank) of dflash train
  // against the dense fixture step (124 GB against 1987 GB here)
  const double train_peak = estimate_memory(c, Workload::kTrain, Where{})[0].peak;
  const double step_peak = estimate_memory(c, Workload::kStep, Where{})[0].peak;
  EXPECT_LT(train_peak, step_peak / 4);
  c.optimized.target_query_chunk = 0;  // 0 = dense
  EXPECT_DOUBLE_EQ(target_items(c, TargetAttention::kQueryChunked)[1].bytes, dense.bytes);
}

// The one byte formatter of the guard and preflight.
TEST(Planner, HumanBytes) {
  EXPECT_EQ(human_bytes(78e9), "78.00 GB");
  EXPECT_EQ(human_bytes(0.1e9), "0.10 GB");
  EXPECT_EQ(human_bytes(45.6e6), "45.6 MB");
  EXPECT_EQ(human_bytes(2.5e9, /*sign=*/true), "+2.50 GB");
  EXPECT_EQ(human_bytes(-3e6, /*sign=*/true), "-3.0 MB");
}

TEST(Planner, SeedVerdicts) {
  const Config c = seed();
  for (const PlanVariant& v : standard_variants(c)) {
    const Plan p = plan_memory(c, v);
    if (v.name == "configured")
      EXPECT_TRUE(p.fits()) << p.format(true);
    else
      EXPECT_FALSE(p.fits()) << v.name << " should be OOM\n" << p.format(true);
  }
  // The split: 5 target ranks and 3 drafter ranks, each 95 GB.
  const Plan p = plan_memory(c, configured_variant(c));
  ASSERT_EQ(p.ranks.size(), 8u);
  EXPECT_EQ(p.ranks[0].role, "target");
  EXPECT_EQ(p.ranks[7].role, "drafter");
  EXPECT_DOUBLE_EQ(p.ranks[7].capacity, 95e9);
}

TEST(Planner, ParameterCountsByHand) {
  // One layer: 2H norms + H*nh*hd (q) + 2*H*nkv*hd (k, v) + nh*hd*H (o) + 2hd + 3HI.
  const LayerShape s{8, 2, 1, 4, 12, 1e6, 1e-6};
  EXPECT_EQ(layer_param_count(s), 16 + 64 + 64 + 64 + 8 + 288);
  Config c;
  c.target.source = "fixture";
  c.target.vocab_size = 10, c.target.num_hidden_layers = 3, c.target.shape = s;
  c.target.tie_word_embeddings = false, c.target.init_std = 0.02, c.target.norm_init_jitter = 0.0;
  c.drafter.num_hidden_layers = 2;
  c.drafter.shape = s;
  c.drafter.target_layer_ids = {0, 2};
  // fc (H x 2H) + hidden_norm + norm + 2 layers.
  EXPECT_EQ(drafter_param_count(c), 8 * 16 + 16 + 2 * 504);
  // embed + lm_head (untied) + 3 layers + final norm.
  EXPECT_EQ(target_param_count(c), 2 * 80 + 3 * 504 + 8);
  c.target.tie_word_embeddings = true;
  EXPECT_EQ(target_param_count(c), 80 + 3 * 504 + 8);
}

TEST(Planner, PeakIsTheLargerOfForwardEndAndBackward) {
  using K = PlanItem::Kind;
  std::vector<PlanItem> items = {{"w", 10, K::kPersistent, ""},
                                 {"g", 4, K::kGradients, ""},
                                 {"ctx", 2, K::kSaved, ""},
                                 {"layers", 6, K::kLayerSaved, ""},
                                 {"loss", 7, K::kForwardTransient, ""},
                                 {"attn", 3, K::kBackwardTransient, ""}};
  std::string largest;
  // forward end 10 + 2 + 6 + 7 = 25; backward 10 + 4 + 2 + 6/3 + 3 = 21.
  EXPECT_DOUBLE_EQ(peak_of(items, 3, &largest), 25);
  EXPECT_EQ(largest, "w");
  items[4].bytes = 1;  // forward end 19; backward 21
  EXPECT_DOUBLE_EQ(peak_of(items, 3), 21);
}

TEST(Planner, OomAgainstCapacityMinusReserve) {
  Config c = seed();
  const double peak = plan_memory(c, configured_variant(c)).ranks[7].peak / 1e9;  // a drafter rank
  c.topology.device_memory_gb.assign(8, peak + c.topology.memory_reserve_gb + 0.5);
  EXPECT_TRUE(plan_memory(c, configured_variant(c)).ranks[7].fits);
  c.topology.memory_reserve_gb += 1.0;  // now capacity - reserve < peak
  const Plan p = plan_memory(c, configured_variant(c));
  EXPECT_FALSE(p.ranks[7].fits);
  EXPECT_NEAR(p.ranks[7].headroom / 1e9, -0.5, 1e-6);
}

// Q = 1024 rows, every one weighted, H = 32, V = 8192, chunk 64.
LossSizes hand_loss() {
  LossSizes z;
  z.M = z.Ns = 1024, z.H = 32, z.V = 8192, z.C = 64;
  return z;
}

TEST(Planner, FusedLossByHand) {
  // KL on, fp32: NsHe + 2CVe + 3CHe + 56M = 131072 + 4194304 + 24576 + 57344.
  EXPECT_DOUBLE_EQ(chunked_loss_bytes(hand_loss(), true, 4).bytes,
                   131072.0 + 4194304 + 24576 + 57344);
}

// The ATen twin's row work on top (bf16: up = 4, a = 4): CV(up + 3a + 1)
// with the KL, CV(up + a) without.
TEST(Planner, FusedLossOfTheAtenKernelsByHand) {
  const double host = chunked_loss_bytes(hand_loss(), true, 2).bytes;
  EXPECT_DOUBLE_EQ(chunked_loss_bytes(hand_loss(), true, 2, optimized::Kernels::kAten).bytes,
                   host + 64.0 * 8192 * (4 + 12 + 1));
  const double host_ce = chunked_loss_bytes(hand_loss(), false, 4).bytes;
  EXPECT_DOUBLE_EQ(chunked_loss_bytes(hand_loss(), false, 4, optimized::Kernels::kAten).bytes,
                   host_ce + 64.0 * 8192 * 4);
}

// A CUDA config is planned with the kernels it will run (aten) and the
// caching allocator's rounding and cached blocks; a CPU one with neither.
TEST(Planner, CudaPlanAssumesAtenKernelsAndTheCachingAllocator) {
  const Config c = seed();  // topology.device = "cuda"
  const PlanVariant v = configured_variant(c);
  EXPECT_EQ(v.kernels, optimized::Kernels::kAten);
  EXPECT_TRUE(v.cuda_allocator);
  const Plan p = plan_memory(c, v);
  const std::string text = p.format(true);
  EXPECT_NE(text.find("(aten kernels, CUDA caching allocator)"), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA caching allocator (2 MiB rounding"), std::string::npos) << text;
  PlanVariant host = v;
  host.kernels = optimized::Kernels::kHost, host.cuda_allocator = false;
  const Plan h = plan_memory(c, host);
  EXPECT_GT(p.ranks[7].peak, h.ranks[7].peak) << "the ATen working set and the allocator add";
  Config cpu = c;
  cpu.topology.device = "cpu";
  EXPECT_EQ(configured_variant(cpu).kernels, optimized::Kernels::kHost);
  EXPECT_FALSE(configured_variant(cpu).cuda_allocator);
}

}  // namespace
}  // namespace dflash::harness
