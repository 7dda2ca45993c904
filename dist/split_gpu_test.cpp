// The target/drafter split on a GPU (label `gpu`, docs/GPU.md): three ranks
// of fixtures/configs/dist-1x2.toml share cuda:0 (one target, two drafters;
// transfers and the gradient all-reduce through host copies over gloo) and
// end with the parameters and losses of one CUDA process with
// --micro-batches 2. Skipped with the reason where there is no CUDA device.
#include <gtest/gtest.h>

#include "core/device.h"
#include "dist/split_test_support.h"
#include "fixtures/test_support.h"

namespace dflash {
namespace {

using namespace testing_support;

TEST(SplitOnCuda, ThreeRanksOnOneDeviceEqualOneProcess) {
  if (const std::string why = cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
  TmpDir tmp;
  const std::string common =
      " --skip-preflight --config " + cfg("dist-1x2.toml") + " --device cuda:0 --steps 3";
  const Shell split = sh(dflash() + " launch --nproc 3 -- train" + common + " --out-dir " +
                         (tmp / "split") + " --out-params " + (tmp / "split.st"));
  const Shell single = sh(dflash() + " train" + common + " --micro-batches 2 --out-dir " +
                          (tmp / "single") + " --out-params " + (tmp / "single.st"));
  expect_same_run(split, single, tmp / "split.st", tmp / "single.st", 3);
}

}  // namespace
}  // namespace dflash
