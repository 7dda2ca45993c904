// What the CUDA runtime says about this machine, without libtorch: runtime
// and driver versions, each device (name, compute capability, total and
// free memory), and whether a kernel compiled into this build runs on it.
// Built from core/cuda_probe.cu when nvcc is present (DFLASH_CUDA); the
// stub in core/cuda_probe_stub.cpp answers "built without CUDA" otherwise.
// Never requires the NVIDIA driver: the runtime loads it lazily and reports
// its absence as an error string.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

struct CudaDevice {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int64_t total_bytes = 0, free_bytes = 0;
  bool kernel_ran = false;  // dflash's probe kernel ran and gave the right answer
  std::string kernel_error;
};

struct CudaProbe {
  bool compiled = false;      // this build has CUDA translation units
  std::string architectures;  // what they were compiled for (CMAKE_CUDA_ARCHITECTURES)
  int runtime_version = 0;    // e.g. 13000 for 13.0; 0 = unknown
  int driver_version = 0;     // 0 = no driver
  std::string error;          // why no device is usable, "" when some are
  std::vector<CudaDevice> devices;
};

// Queries the runtime; with `run_kernel`, launches dflash's probe kernel on
// every device and checks its result.
CudaProbe probe_cuda(bool run_kernel);

}  // namespace dflash
