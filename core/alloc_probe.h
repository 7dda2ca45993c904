// Peak-memory probe on the c10 CPU allocator: a counting wrapper installed
// with c10::SetCPUAllocator. Every CPU tensor allocation is counted (live
// bytes and a high-water mark); scopes reset and read the high-water mark.
// BLAS/oneDNN scratch that bypasses the c10 allocator is not counted.
#pragma once

#include <cstdint>

namespace dflash {

class AllocProbe {
 public:
  // Wraps the current CPU allocator (idempotent). Tensors allocated before
  // the call are not counted while live, and their frees are ignored.
  static void install();
  static int64_t live_bytes();

  // High-water mark of live bytes while the scope is open (nesting-safe).
  class Scope {
   public:
    Scope();
    ~Scope();
    int64_t start_bytes() const { return start_; }
    int64_t peak_bytes() const;  // absolute: includes what was live at entry
    int64_t peak_delta() const { return peak_bytes() - start_; }

   private:
    int64_t start_;
    int64_t saved_peak_;
  };
};

}  // namespace dflash
