// The target/drafter split on gloo over loopback, through `dflash launch`:
// the same parameters and loss as one process running the same micro-batches
// (float64 tight), the per-rank-normalisation mutant killed, a dead or hung
// rank ending the run within the timeout with its name, and a config that
// differs on one rank refused at startup.
#include "train/dist.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "core/env.h"
#include "core/safetensors.h"
#include "fixtures/test_support.h"
#include "harness/tolerance.h"
#include "train/split_test_support.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

using testing_support::cfg;
using testing_support::compare_params;
using testing_support::dflash;
using testing_support::losses;
using testing_support::sh;
using testing_support::Shell;
using testing_support::TmpDir;

// A fresh run directory per launch (the split's drafter rank 0 writes
// metrics, checkpoints and a report there); removed when the test ends.
std::string run_dir() {
  static TmpDir runs;
  static int n = 0;
  return runs / ("run" + std::to_string(n++));
}

struct SplitCase {
  const char* name;
  const char* config;
  int nproc, steps;
};

class SplitEqualsOneProcess : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitEqualsOneProcess, SameParametersAndLoss) {
  const SplitCase& c = GetParam();
  TmpDir tmp;
  const Shell split =
      sh(dflash() + " launch --nproc " + std::to_string(c.nproc) +
         " -- train --skip-preflight --out-dir " + run_dir() + " --config " + cfg(c.config) +
         " --steps " + std::to_string(c.steps) + " --out-params " + (tmp / "split.st"));
  ASSERT_EQ(split.code, 0) << split.out;
  const Shell single = sh(dflash() + " train --skip-preflight --out-dir " + (tmp / "run") +
                          " --config " + cfg(c.config) + " --steps " + std::to_string(c.steps) +
                          " --micro-batches 2 --out-params " + (tmp / "single.st"));
  ASSERT_EQ(single.code, 0) << single.out;
  const auto rep = compare_params(tmp / "split.st", tmp / "single.st");
  EXPECT_TRUE(rep.ok()) << rep.format();
  const auto ls = losses(split.out), l1 = losses(single.out);
  ASSERT_EQ(ls.size(), size_t(c.steps)) << split.out;
  ASSERT_EQ(l1.size(), size_t(c.steps)) << single.out;
  for (size_t i = 0; i < ls.size(); ++i) EXPECT_NEAR(ls[i], l1[i], 1e-10 * (1 + std::abs(l1[i])));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SplitEqualsOneProcess,
    ::testing::Values(SplitCase{"two_targets_two_drafters_one_step", "dist-2x2.toml", 4, 1},
                      SplitCase{"one_target_two_drafters_three_steps", "dist-1x2.toml", 3, 3}),
    [](const auto& i) { return std::string(i.param.name); });

TEST(DistZoo, PerRankNormalisationIsKilled) {
  TmpDir tmp;
  const Shell split =
      sh(dflash() + " launch --nproc 3 -- train --skip-preflight --out-dir " + run_dir() +
         " --config " + cfg("dist-1x2.toml") +
         " --steps 1 --zoo-per-rank-normalisation --out-params " + (tmp / "split.st"));
  ASSERT_EQ(split.code, 0) << split.out;
  const Shell single =
      sh(dflash() + " train --skip-preflight --out-dir " + (tmp / "run") + " --config " +
         cfg("dist-1x2.toml") + " --steps 1 --micro-batches 2 --out-params " + (tmp / "single.st"));
  ASSERT_EQ(single.code, 0) << single.out;
  EXPECT_FALSE(compare_params(tmp / "split.st", tmp / "single.st").ok())
      << "the per-rank-normalisation mutant matched the single-process run";
}

TEST(DistFaults, DeadRankEndsTheRunAndIsNamed) {
  const Shell r =
      sh(dflash() + " launch --nproc 3 -- train --skip-preflight --out-dir " + run_dir() +
         " --config " + cfg("dist-1x2.toml") + " --steps 3 --fault rank=2,step=1,mode=exit");
  EXPECT_EQ(r.code, 17) << r.out;  // the failing rank's exit code
  EXPECT_NE(r.out.find("rank 2 exited with code 17"), std::string::npos) << r.out;
}

TEST(DistFaults, HungRankIsNamedByTheOthersWithinTheTimeout) {
  // Rank 1 stops (SIGSTOP) at step 1; the others time out after 4 s and name
  // it from its silent heartbeat; the launcher then ends every rank.
  TmpDir tmp;
  const Shell copy = sh("sed 's/^timeout_s = 20.0/timeout_s = 4.0/' " + cfg("dist-1x2.toml") +
                        " > " + (tmp / "fast.toml"));
  ASSERT_EQ(copy.code, 0);
  const Shell r =
      sh(dflash() + " launch --nproc 3 -- train --skip-preflight --out-dir " + run_dir() +
         " --config " + (tmp / "fast.toml") + " --steps 3 --fault rank=1,step=1,mode=hang");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("silent: rank 1"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 4.0 + 15.0) << "did not end within the timeout (+ start-up and grace)";
}

TEST(DistStartup, ConfigDifferingOnOneRankIsRefused) {
  const Shell r = sh("DFLASH_TEST_PERTURB_CONFIG_RANK=1 " + dflash() +
                     " launch --nproc 3 -- train --skip-preflight --out-dir " + run_dir() +
                     " --config " + cfg("dist-1x2.toml") + " --steps 1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("differs on rank 1"), std::string::npos) << r.out;
}

TEST(DistStartup, WorldSizeMismatchIsRefused) {
  const Shell r = sh(dflash() + " launch --nproc 2 -- train --skip-preflight --out-dir " +
                     run_dir() + " --config " + cfg("dist-1x2.toml") + " --steps 1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("topology.world_size is 3 but the launcher started 2"), std::string::npos)
      << r.out;
}

// The NCCL plugin (libdflash_nccl.so) loads here too; without a CUDA device
// ProcessGroupNCCL refuses, and the refusal arrives as a DistError naming it
// instead of a crash (the CUDA split then says why it cannot use NCCL).
TEST(DistNccl, PluginLoadsAndReportsWhyNcclCannotRun) {
  std::string why;
  if (!load_torch_cuda(&why)) GTEST_SKIP() << "a CPU-only libtorch: " << why;
  if (at::detail::getCUDAHooks().deviceCount() > 0) GTEST_SKIP() << "a GPU is here: train.Nccl.*";
  try {
    dist::nccl_backend(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                       std::chrono::milliseconds(1000));
    ADD_FAILURE() << "ProcessGroupNCCL was created without a CUDA device";
  } catch (const dist::DistError& e) {
    EXPECT_NE(std::string(e.what()).find("ProcessGroupNCCL"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dflash
