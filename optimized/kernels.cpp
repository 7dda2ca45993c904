#include "optimized/kernels.h"

#include <c10/util/Exception.h>

namespace dflash::optimized {

const char* kernels_name(Kernels k) { return k == Kernels::kHost ? "host" : "aten"; }

Kernels resolve_kernels(const std::string& choice, const c10::Device& device) {
  if (choice == "aten") return Kernels::kAten;
  if (choice == "host") {
    TORCH_CHECK(device.is_cpu(),
                "optimized.kernels = \"host\": the host row kernels run on CPU "
                "tensors only, found ",
                device.str(), " (use \"aten\" or \"auto\")");
    return Kernels::kHost;
  }
  TORCH_CHECK(choice == "auto",
              "optimized.kernels: expected one of \"auto\", \"host\", \"aten\", "
              "found \"",
              choice, "\"");
  return device.is_cpu() ? Kernels::kHost : Kernels::kAten;
}

}  // namespace dflash::optimized
