// A one-rank NCCL group on the GPU check's machine (label `gpu`): c10d's
// ProcessGroupNCCL from the wheel's libtorch_cuda (linked into this test
// only) all-reduces and broadcasts a CUDA tensor. Skipped with the reason
// where there is no CUDA device. The target/drafter split itself still runs
// on gloo (docs/DISTRIBUTED.md); this is the NCCL transport's smoke test.
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "core/device.h"
#include "core/env.h"

namespace dflash {
namespace {

TEST(Nccl, OneRankGroupAllReducesAndBroadcastsOnTheDevice) {
  std::string why;
  if (!load_torch_cuda(&why)) GTEST_SKIP() << "no CUDA: " << why;
  if (at::detail::getCUDAHooks().deviceCount() == 0)
    GTEST_SKIP() << "no CUDA device visible (driver missing or CUDA_VISIBLE_DEVICES empty)";
  const c10::Device dev(c10::kCUDA, 0);
  activate_device(dev, "the NCCL test");
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1, opts);
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
