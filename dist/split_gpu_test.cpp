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
  ASSERT_EQ(split.code, 0) << split.out;
  const Shell single = sh(dflash() + " train" + common + " --micro-batches 2 --out-dir " +
                          (tmp / "single") + " --out-params " + (tmp / "single.st"));
  ASSERT_EQ(single.code, 0) << single.out;
  const auto rep = compare_params(tmp / "split.st", tmp / "single.st");
  EXPECT_TRUE(rep.ok()) << rep.format();
  const auto ls = losses(split.out), l1 = losses(single.out);
  ASSERT_EQ(ls.size(), 3u) << split.out;
  ASSERT_EQ(l1.size(), 3u) << single.out;
  for (size_t i = 0; i < ls.size(); ++i) EXPECT_NEAR(ls[i], l1[i], 1e-10 * (1 + std::abs(l1[i])));
}

}  // namespace
}  // namespace dflash
