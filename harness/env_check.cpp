#include "harness/env_check.h"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

namespace dflash::harness {
namespace {

constexpr const char* kElsewhere =
    "To check this config for another machine, run `dflash env --json F` there and pass "
    "`--env F`; to plan from here without any environment check, pass "
    "`--plan-for-another-machine` (the verdict says the check was skipped).";

EnvVerdict fail(std::string figure, std::string detail) {
  return {false, std::move(figure), std::move(detail) + "\n" + kElsewhere};
}

EnvVerdict check_cpu(const Config& c, const Environment& env) {
  return {true,
          fmt::format("cpu: {} cores, {:.1f} GB host memory; libtorch {}", env.cores,
                      env.host_memory_bytes / 1e9, env.torch_version),
          ""};
}

// A device per local rank, each with the memory its rank was planned for,
// each running dflash's probe kernel.
EnvVerdict check_cuda_devices(const Config& c, const Environment& env, int64_t ranks_here) {
  const auto& tp = c.topology;
  const int64_t n = int64_t(env.cuda.devices.size());
  if (ranks_here > n)
    return fail(fmt::format("{} ranks on this node, {} CUDA devices", ranks_here, n),
                fmt::format("{}: {} ranks run on this node ({}) but {} offers {} CUDA device{} "
                            "(CUDA_VISIBLE_DEVICES limits what a process sees)",
                            c.path, ranks_here,
                            ranks_here == tp.world_size ? "topology.world_size"
                                                        : "torchrun's LOCAL_WORLD_SIZE",
                            env.source, n, n == 1 ? "" : "s"));
  for (int64_t r = 0; r < ranks_here; ++r) {
    const CudaDevice& d = env.cuda.devices[size_t(r)];
    if (!d.kernel_error.empty())
      return fail(fmt::format("cuda:{} cannot run dflash's kernels", d.index),
                  fmt::format("cuda:{} ({}, sm_{}{}) failed dflash's probe kernel: {} (this build "
                              "targets sm_{})",
                              d.index, d.name, d.cc_major, d.cc_minor, d.kernel_error,
                              env.cuda.architectures));
    if (tp.device_memory_gb.empty()) continue;
    // Rank r runs on local device r % ranks_here; the ranks of this node
    // are the first ranks_here of the topology when torchrun did not say.
    const double want = tp.device_memory_gb[size_t(r)] * 1e9;
    if (double(d.total_bytes) < want)
      return fail(fmt::format("cuda:{} has {:.1f} GB, the plan assumes {:.1f} GB", d.index,
                              d.total_bytes / 1e9, want / 1e9),
                  fmt::format("{}: topology.device_memory_gb[{}] = {} GB, but cuda:{} ({}) of {} "
                              "has {:.2f} GB in total",
                              c.path, r, tp.device_memory_gb[size_t(r)], d.index, d.name,
                              env.source, d.total_bytes / 1e9));
  }
  const CudaDevice& d0 = env.cuda.devices[0];
  return {true,
          fmt::format("cuda: {} of {} devices ({}, {:.0f} GB); libtorch {} CUDA {}, NCCL {}",
                      ranks_here, n, d0.name, d0.total_bytes / 1e9, env.torch_version,
                      env.torch_cuda_version, env.nccl_version.empty() ? "none" : env.nccl_version),
          ""};
}

// topology.device = "cuda:N": every rank of this node shares device N, which
// must exist, run dflash's probe kernel and hold the ranks' plans together.
EnvVerdict check_pinned_device(const Config& c, const Environment& env, int64_t ranks_here) {
  const auto& tp = c.topology;
  const int64_t index = std::stoll(tp.device.substr(5)), n = int64_t(env.cuda.devices.size());
  if (index >= n)
    return fail(fmt::format("no {}", tp.device),
                fmt::format("{}: topology.device = \"{}\", but {} offers {} CUDA device{}", c.path,
                            tp.device, env.source, n, n == 1 ? "" : "s"));
  const CudaDevice& d = env.cuda.devices[size_t(index)];
  if (!d.kernel_error.empty())
    return fail(fmt::format("{} cannot run dflash's kernels", tp.device),
                fmt::format("{} ({}, sm_{}{}) failed dflash's probe kernel: {}", tp.device, d.name,
                            d.cc_major, d.cc_minor, d.kernel_error));
  double want = 0;
  for (int64_t r = 0; r < ranks_here && r < int64_t(tp.device_memory_gb.size()); ++r)
    want += tp.device_memory_gb[size_t(r)] * 1e9;
  if (double(d.total_bytes) < want)
    return fail(fmt::format("{} has {:.1f} GB, its {} ranks are planned for {:.1f} GB", tp.device,
                            d.total_bytes / 1e9, ranks_here, want / 1e9),
                fmt::format("{}: the {} ranks pinned to {} share it; topology.device_memory_gb "
                            "sums to {:.2f} GB, it has {:.2f} GB",
                            c.path, ranks_here, tp.device, want / 1e9, d.total_bytes / 1e9));
  return {true,
          fmt::format("{}: {} rank{} on one device ({}, {:.0f} GB); libtorch {} CUDA {}", tp.device,
                      ranks_here, ranks_here == 1 ? "" : "s", d.name, d.total_bytes / 1e9,
                      env.torch_version, env.torch_cuda_version),
          ""};
}

}  // namespace

EnvVerdict check_environment(const Config& c, const Environment& env, int64_t local_world_size) {
  const auto& tp = c.topology;
  if (tp.device == "cpu") return check_cpu(c, env);
  if (!env.torch_cuda)
    return fail("libtorch without CUDA",
                fmt::format("{}: topology.device = \"{}\", but the libtorch of {} is a CPU "
                            "build (torch {})",
                            c.path, tp.device, env.source, env.torch_version));
  if (env.cuda.devices.empty())
    return fail(
        "no CUDA device",
        fmt::format("{}: topology.device = \"{}\", but {} has no usable CUDA device: {}", c.path,
                    tp.device, env.source, env.cuda.error.empty() ? "none found" : env.cuda.error));
  const int64_t ranks_here = local_world_size > 0 ? local_world_size : tp.world_size;
  if (tp.device != "cuda") return check_pinned_device(c, env, ranks_here);
  return check_cuda_devices(c, env, ranks_here);
}

int64_t local_world_size_from_process() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (*end || x < 1)
    throw std::runtime_error(
        fmt::format("environment variable LOCAL_WORLD_SIZE={} is not a positive integer", v));
  return x;
}

}  // namespace dflash::harness
