// libdflash_nccl.so: c10d's NCCL backend for the target/drafter split,
// loaded on demand (dlopen, dist/cluster.cpp) when every rank of a CUDA run has
// a device of its own. A plugin keeps libtorch_cuda's ProcessGroupNCCL out of
// the dflash binary, which starts without any CUDA library (issue 14).
#include <chrono>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

// A ProcessGroupNCCL over `store` (one reference added; the caller reclaims
// the returned one). `error` receives the message when creation throws.
extern "C" __attribute__((visibility("default"))) c10d::Backend* dflash_nccl_backend(
    c10d::Store* store, int rank, int size, int64_t timeout_ms, char* error, size_t error_size) {
  try {
    auto s = c10::intrusive_ptr<c10d::Store>::reclaim_copy(store);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(timeout_ms);
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, size, opts).release();
  } catch (const std::exception& e) {
    if (error && error_size) {
      std::snprintf(error, error_size, "%s", e.what());
    }
    return nullptr;
  }
}
