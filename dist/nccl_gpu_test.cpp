// A one-rank NCCL group on the GPU check's machine (label `gpu`): the
// ProcessGroupNCCL that dist/cluster.cpp creates for a CUDA split, from
// libdflash_nccl.so (dlopened: dist/nccl_plugin.cpp), all-reduces and
// broadcasts a CUDA tensor and a host tensor staged the way the Cluster
// stages them. Skipped with the reason where there is no CUDA device. (The
// split over NCCL itself needs one GPU per rank: the GPU check's machine has
// one, so the split's own test, dist.SplitOnCuda, runs on gloo.)
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "core/device.h"
#include "dist/cluster.h"

namespace dflash {
namespace {

TEST(Nccl, OneRankGroupFromThePluginAllReducesAndBroadcasts) {
  if (const std::string why = cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const c10::Device dev(c10::kCUDA, 0);
  activate_device(dev, "the NCCL test");
  auto pg = dist::nccl_backend(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                               std::chrono::milliseconds(60000));
  std::vector<at::Tensor> t{at::full({1024}, 3.0, at::TensorOptions().device(dev))};
  ASSERT_TRUE(pg->allreduce(t)->wait());
  EXPECT_EQ(t[0].sum().item<double>(), 3072.0);
  std::vector<at::Tensor> b{at::arange(16, at::TensorOptions().device(dev).dtype(at::kFloat))};
  ASSERT_TRUE(pg->broadcast(b)->wait());
  EXPECT_EQ(b[0].sum().item<double>(), 120.0);
  pg->shutdown();
}

}  // namespace
}  // namespace dflash
