#include "core/files.h"

#include <fstream>
#include <sstream>

namespace dflash {

std::optional<std::string> read_file_if_present(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dflash
