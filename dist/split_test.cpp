// The target/drafter split on gloo over loopback, through `dflash launch`:
// the same parameters and loss as one process running the same micro-batches
// (float64 tight), the per-rank-normalisation mutant killed, a dead or hung
// rank ending the run within the timeout with its name, and a config that
// differs on one rank refused at startup.
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
#include "dist/cluster.h"
#include "dist/split_test_support.h"
#include "fixtures/test_support.h"
#include "harness/tolerance.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

using testing_support::cfg;
using testing_support::compare_params;
using testing_support::dflash;
using testing_support::expect_same_run;
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
  const Shell single = sh(dflash() + " train --skip-preflight --out-dir " + (tmp / "run") +
                          " --config " + cfg(c.config) + " --steps " + std::to_string(c.steps) +
                          " --micro-batches 2 --out-params " + (tmp / "single.st"));
  expect_same_run(split, single, tmp / "split.st", tmp / "single.st", size_t(c.steps));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SplitEqualsOneProcess,
    ::testing::Values(SplitCase{"two_targets_two_drafters_one_step", "dist-2x2.toml", 4, 1},
                      SplitCase{"one_target_two_drafters_three_steps", "dist-1x2.toml", 3, 3}),
    [](const auto& i) { return std::string(i.param.name); });

// Without target ranks (data.source = "features", the path of a target
// dflash does not run): every drafter reads its own micro-batches from the
// features directory, and the run equals one process's.
TEST(DistFeatures, DraftersWithoutTargetRanksEqualOneProcess) {
  TmpDir tmp;
  const std::string c = cfg("dist-1x2.toml");
  const std::string one =
      " --set topology.world_size=1 --set 'topology.target_ranks=[0]' "
      "--set 'topology.drafter_ranks=[0]'";
  const Shell fe = sh(dflash() + " features --config " + c +
                      " --set 'data.source=\"self_distill\"' --set data.num_samples=12 "
                      "--set data.eval_samples=2" +
                      one + " --out " + (tmp / "feats"));
  ASSERT_EQ(fe.code, 0) << fe.out;
  const std::string feats =
      " --set 'data.source=\"features\"' --set 'data.path=\"" + (tmp / "feats") + "\"'";
  const Shell split = sh(dflash() + " launch --nproc 2 -- train --skip-preflight --out-dir " +
                         run_dir() + " --config " + c + feats +
                         " --set topology.world_size=2 --set 'topology.target_ranks=[]' "
                         "--set 'topology.drafter_ranks=[0, 1]' --steps 3 --out-params " +
                         (tmp / "split.st"));
  const Shell single =
      sh(dflash() + " train --skip-preflight --out-dir " + (tmp / "run") + " --config " + c +
         feats + one + " --steps 3 --micro-batches 2 --out-params " + (tmp / "single.st"));
  expect_same_run(split, single, tmp / "split.st", tmp / "single.st", 3);
  // Without features, a topology without target ranks is refused.
  const Shell refused = sh(dflash() + " validate --config " + c +
                           " --set topology.world_size=2 --set 'topology.target_ranks=[]' "
                           "--set 'topology.drafter_ranks=[0, 1]'");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.out.find("topology.target_ranks: expected at least one target rank"),
            std::string::npos)
      << refused.out;
}

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
  const Shell r = sh(
      dflash() + " launch --nproc 3 --grace 60 -- train --skip-preflight --out-dir " + run_dir() +
      " --config " + cfg("dist-1x2.toml") + " --steps 3 --fault rank=2,step=1,mode=exit");
  EXPECT_EQ(r.code, 17) << r.out;  // the failing rank's exit code
  EXPECT_NE(r.out.find("rank 2 exited with code 17"), std::string::npos) << r.out;
  // The launcher's SIGTERM ends the others at once: their stop handlers do
  // not take it for a stop request (then they would run into the dead rank
  // themselves and report it after sampling the heartbeats, or wait for
  // timeout_s, 20 s, or the grace, 60 s).
  EXPECT_EQ(r.out.find("heartbeats:"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 15.0) << r.out;
}

TEST(DistFaults, HungRankIsNamedByTheOthersWithinTheTimeout) {
  // Rank 1 stops (SIGSTOP) at step 1; the others time out after 4 s and name
  // it from its silent heartbeat; the launcher then ends every rank.
  TmpDir tmp;
  const Shell copy = sh("sed 's/^timeout_s = 20.0/timeout_s = 4.0/' " + cfg("dist-1x2.toml") +
                        " > " + (tmp / "fast.toml"));
  ASSERT_EQ(copy.code, 0);
  // Baseline in the same run and on the same machine load: the same launch
  // without the fault (start-up, three steps, shutdown).
  const Shell clean = sh(dflash() + " launch --nproc 3 -- train --skip-preflight --out-dir " +
                         run_dir() + " --config " + (tmp / "fast.toml") + " --steps 3");
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Shell r =
      sh(dflash() + " launch --nproc 3 -- train --skip-preflight --out-dir " + run_dir() +
         " --config " + (tmp / "fast.toml") + " --steps 3 --fault rank=1,step=1,mode=hang");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("silent: rank 1"), std::string::npos) << r.out;
  // The hang ends one timeout (4 s) after it starts, plus the launcher's
  // grace: under twice the fault-free run plus two timeouts whatever the
  // machine's speed (the default timeout, 20 s, would exceed it).
  EXPECT_LT(r.seconds, 2 * clean.seconds + 2 * 4.0)
      << "did not end within the timeout (fault-free run: " << clean.seconds << " s)";
}

// SIGTERM to the launcher (what a cluster scheduler sends) in step 2: it is
// forwarded to every rank, the drafters stop after the same step (2, or 3
// when the signal lands after step 2's all-reduce), drafter rank 0
// checkpoints it, the target rank stops sending, every rank exits without
// waiting for a timeout, the launcher exits 143 naming --resume, and the
// resumed launch ends with the uninterrupted run's parameters, bit for bit.
TEST(DistSignals, SigtermToTheLauncherCheckpointsAndResumeIsBitExact) {
  TmpDir tmp;
  const std::string dir = run_dir();
  auto launch = [&](const std::string& env, const std::string& out, const std::string& params,
                    const std::string& extra) {
    return sh(env + " " + dflash() + " launch --nproc 3 -- train --skip-preflight --out-dir " +
              out + " --config " + cfg("dist-1x2.toml") + " --steps 5 --out-params " + params +
              extra);
  };
  const Shell clean = launch("", run_dir(), tmp / "clean.st", "");
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Shell stopped =
      launch("DFLASH_TEST_SIGNAL_LAUNCHER_IN_STEP=2", dir, tmp / "resumed.st", "");
  EXPECT_EQ(stopped.code, 143) << stopped.out;
  EXPECT_NE(stopped.out.find("stopped by SIGTERM"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("-- train --skip-preflight --out-dir " + dir), std::string::npos)
      << stopped.out;
  EXPECT_NE(stopped.out.find(" --resume\n"), std::string::npos) << stopped.out;
  EXPECT_EQ(stopped.out.find("stopping the other ranks"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("target rank 0: stopped by SIGTERM with the drafters"),
            std::string::npos)
      << stopped.out;
  EXPECT_LT(stopped.seconds, clean.seconds + 10.0)  // timeout_s is 20
      << "a rank waited for a timeout (uninterrupted run: " << clean.seconds << " s)";
  const bool at2 = fs::exists(dir + "/checkpoints/step-000002/model.safetensors");
  const bool at3 = fs::exists(dir + "/checkpoints/step-000003/model.safetensors");
  ASSERT_TRUE(at2 || at3) << stopped.out;
  EXPECT_FALSE(fs::exists(tmp / "resumed.st")) << "the stopped run wrote its final parameters";
  const Shell resumed = launch("", dir, tmp / "resumed.st", " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out.find(at2 ? "step     2  loss" : "step     3  loss"), std::string::npos)
      << resumed.out;  // continued from the checkpoint, which loaded
  const auto a = safetensors::read(tmp / "clean.st"), b = safetensors::read(tmp / "resumed.st");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(at::equal(t, b.get(name))) << name;
}

// SIGINT (a terminal's Ctrl-C reaches the launcher alone: the ranks have
// process groups of their own) stops the same way, with 130.
TEST(DistSignals, SigintToTheLauncherStopsEveryRankWith130) {
  const std::string dir = run_dir();
  const Shell r = sh("DFLASH_TEST_SIGNAL_LAUNCHER_IN_STEP=1,int " + dflash() +
                     " launch --nproc 3 -- train --skip-preflight --out-dir " + dir + " --config " +
                     cfg("dist-1x2.toml") + " --steps 4");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("stopped by SIGINT"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step-000001") ||
              fs::exists(dir + "/checkpoints/step-000002"))
      << r.out;
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
  if (at::detail::getCUDAHooks().deviceCount() > 0) GTEST_SKIP() << "a GPU is here: dist.Nccl.*";
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
