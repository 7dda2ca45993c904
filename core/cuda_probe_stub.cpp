// core/cuda_probe.h for a build without nvcc (DFLASH_CUDA=OFF).
#include "core/cuda_probe.h"

namespace dflash {

CudaProbe probe_cuda(bool) {
  CudaProbe r;
  r.error = "this dflash was built without CUDA (DFLASH_CUDA=OFF)";
  return r;
}

}  // namespace dflash
