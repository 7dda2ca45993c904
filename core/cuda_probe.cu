// The CUDA runtime side of `dflash env` (see core/cuda_probe.h): device
// queries plus one real kernel, so that a build whose architectures do not
// match the device ("no kernel image is available") is found before a run.
#include <cuda_runtime_api.h>

#include <string>

#include "core/cuda_probe.h"

#ifndef DFLASH_CUDA_ARCHITECTURES
#define DFLASH_CUDA_ARCHITECTURES "unknown"
#endif

namespace dflash {
namespace {

// y[i] = a * i + b over a grid-stride loop: a result that only a kernel
// that really ran on every element can produce.
__global__ void probe_kernel(int* y, int n, int a, int b) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = a * i + b;
}

std::string describe(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Runs the probe kernel on the current device; "" on success.
std::string run_probe_kernel() {
  constexpr int n = 4096, a = 3, b = 7;
  int* d = nullptr;
  cudaError_t e = cudaMalloc(&d, n * sizeof(int));
  if (e != cudaSuccess) return "cudaMalloc: " + describe(e);
  probe_kernel<<<8, 128>>>(d, n, a, b);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  std::string err = e == cudaSuccess ? "" : "probe kernel: " + describe(e);
  if (err.empty()) {
    static int host[n];
    e = cudaMemcpy(host, d, n * sizeof(int), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) err = "cudaMemcpy: " + describe(e);
    for (int i = 0; err.empty() && i < n; ++i)
      if (host[i] != a * i + b)
        err = "probe kernel wrote " + std::to_string(host[i]) + " at " + std::to_string(i) +
              ", expected " + std::to_string(a * i + b);
  }
  cudaFree(d);
  return err;
}

CudaDevice query_device(int i, bool run_kernel) {
  CudaDevice d;
  d.index = i;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, i) == cudaSuccess) {
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.total_bytes = int64_t(p.totalGlobalMem);
  }
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    d.free_bytes = int64_t(free_b);
    d.total_bytes = int64_t(total_b);
  }
  if (run_kernel) {
    d.kernel_error = run_probe_kernel();
    d.kernel_ran = d.kernel_error.empty();
  }
  return d;
}

}  // namespace

CudaProbe probe_cuda(bool run_kernel) {
  CudaProbe r;
  r.compiled = true;
  r.architectures = DFLASH_CUDA_ARCHITECTURES;
  cudaRuntimeGetVersion(&r.runtime_version);
  if (cudaDriverGetVersion(&r.driver_version) != cudaSuccess) r.driver_version = 0;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    r.error = describe(e);
    return r;
  }
  for (int i = 0; i < count; ++i) r.devices.push_back(query_device(i, run_kernel));
  if (count == 0) r.error = "the CUDA runtime reports no device";
  return r;
}

}  // namespace dflash
