// FNV-1a 64 over bytes: the one checksum of the project (config hashes,
// corpus listings, tensor checksums other tools recompute in a few lines,
// derive_seed's stream names, the identity of a features directory's target).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dflash {

inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
inline uint64_t fnv1a64(std::string_view s) { return fnv1a64(s.data(), s.size()); }

}  // namespace dflash
