// Which implementation of the fused loss and the block-sparse attention runs
// ([optimized] kernels, docs/GPU.md). Both share the loops, chunking, tiling
// and autograd functions; they differ only in the element-wise row work:
//   host  the row kernels of row_kernels.h: plain C++ over CPU memory.
//   aten  the ATen twins of aten_rows.h: tensor operations only, so the very
//         same code runs on CPU (where the tests prove it) and on CUDA.
// "auto" picks host for CPU tensors and aten for every other device.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace dflash::optimized {

enum class Kernels { kHost, kAten };

const char* kernels_name(Kernels k);

// `choice` is the config's value ("auto", "host", "aten"); "host" on a
// non-CPU device is an error naming the key.
Kernels resolve_kernels(const std::string& choice, const c10::Device& device);

}  // namespace dflash::optimized
