// The project's own safetensors reader/writer. Format: 8-byte little-endian
// header length N, N bytes of JSON header {name: {dtype, shape, data_offsets},
// "__metadata__": {str: str}}, then the raw little-endian tensor bytes.
// Reading validates everything before touching data: truncated files,
// oversized or malformed headers, unknown dtypes, offsets out of range or
// overlapping, and shape/size mismatches each raise SafetensorsError naming
// the file and the tensor. Writing is atomic (temp file + rename).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dflash::safetensors {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Header size limit, as in the reference implementation (100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u * 1000u * 1000u;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using Metadata = std::map<std::string, std::string>;

struct File {
  std::string label;     // path (or buffer name) for messages
  NamedTensors tensors;  // in header order
  Metadata metadata;

  bool has(const std::string& name) const;
  // Throws SafetensorsError naming the file and tensor when missing.
  const at::Tensor& get(const std::string& name) const;
  const std::string& meta(const std::string& key) const;
};

File parse(const std::string& bytes, const std::string& label);
File read(const std::string& path);

std::string serialize(const NamedTensors& tensors, const Metadata& metadata);
void write(const std::string& path, const NamedTensors& tensors, const Metadata& metadata);

// "F32", "BF16", ... for a tensor's dtype (throws for unsupported ones).
std::string dtype_code(at::ScalarType t);

// A whole file's bytes; throws std::runtime_error "PATH: cannot open WHAT".
// Atomic file write used by every writer in the project: temp + rename.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync of a file or directory (best effort: ignored where it cannot open it).
void fsync_path(const std::string& path);

}  // namespace dflash::safetensors
