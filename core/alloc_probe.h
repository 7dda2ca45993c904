// Peak-memory probe. On CPU: a counting wrapper around the c10 CPU
// allocator (c10::SetCPUAllocator); every CPU tensor allocation is counted
// (live bytes and a high-water mark). BLAS/oneDNN scratch that bypasses the
// c10 allocator is not counted. On a CUDA device: the caching allocator's own
// statistics (allocated bytes, current and peak; the peak reset per scope),
// through c10's DeviceAllocator interface, so no CUDA symbol is linked. Scopes
// reset and read the high-water mark of their device the same way on both.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace dflash {

class AllocProbe {
 public:
  // Wraps the current CPU allocator (idempotent). Tensors allocated before
  // the call are not counted while live, and their frees are ignored.
  static void install();
  static int64_t live_bytes();
  // Live bytes on `device` (CPU: the counting wrapper; CUDA: allocated bytes).
  static int64_t live_bytes(const c10::Device& device);

  // High-water mark of live bytes on `device` while the scope is open
  // (nesting-safe). A CUDA device needs libtorch_cuda loaded (load_torch_cuda).
  class Scope {
   public:
    explicit Scope(c10::Device device = c10::Device(c10::kCPU));
    ~Scope();
    int64_t start_bytes() const { return start_; }
    int64_t peak_bytes() const;  // absolute: includes what was live at entry
    int64_t peak_delta() const { return peak_bytes() - start_; }

   private:
    c10::Device device_;
    int64_t start_;
    int64_t saved_peak_;
  };
};

}  // namespace dflash
