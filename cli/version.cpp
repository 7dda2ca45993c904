// `dflash --version`: this binary's version and what it was built against.
// Compiled on its own (no precompiled header) with the definitions that
// cli/CMakeLists.txt passes from the project and cmake/TORCH_VERSION.
#include <string>

#include "cli/commands.h"

namespace dflash::cli {

std::string version_text() {
  return std::string("dflash ") + DFLASH_VERSION + " (libtorch " + DFLASH_TORCH_VERSION +
         (DFLASH_CUDA_BUILD ? ", CUDA code compiled in)" : ", CPU only)");
}

}  // namespace dflash::cli
