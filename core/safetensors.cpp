#include "core/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/files.h"

namespace dflash::safetensors {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

struct DtypeInfo {
  const char* code;
  at::ScalarType type;
  int64_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8},    {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2}, {"I64", at::kLong, 8},  {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},     {"I8", at::kChar, 1},   {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
};

const DtypeInfo* find_code(const std::string& code) {
  for (const auto& d : kDtypes)
    if (code == d.code) return &d;
  return nullptr;
}

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw SafetensorsError(fmt::format("{}: {}", label, what));
}

uint64_t read_u64_le(const std::string& b) {
  uint64_t v = 0;
  std::memcpy(&v, b.data(), 8);
  return v;
}

std::vector<int64_t> parse_shape(const nlohmann::ordered_json& e, const std::string& label,
                                 const std::string& name) {
  if (!e.contains("shape") || !e["shape"].is_array())
    fail(label, fmt::format("tensor '{}': 'shape' must be an array of integers", name));
  std::vector<int64_t> shape;
  for (const auto& d : e["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      fail(label, fmt::format("tensor '{}': shape entries must be integers in [0, 2^63), found {}",
                              name, d.dump()));
    shape.push_back(int64_t(d.get<uint64_t>()));
  }
  return shape;
}

// Validated placement of one tensor in the data buffer.
struct Entry {
  std::string name;
  const DtypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& name, const nlohmann::ordered_json& e, uint64_t data_size,
                  const std::string& label) {
  if (!e.is_object()) fail(label, fmt::format("tensor '{}': entry must be an object", name));
  if (!e.contains("dtype") || !e["dtype"].is_string())
    fail(label, fmt::format("tensor '{}': missing string 'dtype'", name));
  const std::string code = e["dtype"].get<std::string>();
  const DtypeInfo* dt = find_code(code);
  if (!dt)
    fail(label, fmt::format("tensor '{}': unknown dtype '{}' (supported: F64 F32 F16 BF16 "
                            "I64 I32 I16 I8 U8 BOOL)",
                            name, code));
  auto shape = parse_shape(e, label, name);
  const auto& off = e.contains("data_offsets") ? e["data_offsets"] : nlohmann::ordered_json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    fail(label, fmt::format("tensor '{}': 'data_offsets' must be [begin, end]", name));
  uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end || end > data_size)
    fail(label, fmt::format("tensor '{}': data_offsets [{}, {}] out of range (data is {} bytes)",
                            name, begin, end, data_size));
  // numel * element size, guarding overflow: a zero dimension anywhere makes
  // it 0 (the early stop once the product exceeds the data must not skip a
  // later 0: shape [3, 0] in a file with under 6 data bytes is valid; found
  // by fuzz_safetensors' round trip).
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  unsigned __int128 bytes = empty ? 0 : uint64_t(dt->bytes);
  for (int64_t d : shape) {
    if (empty) break;
    bytes *= uint64_t(d);
    if (bytes > (unsigned __int128)data_size + 1) break;
  }
  if (bytes != end - begin)
    fail(label,
         fmt::format("tensor '{}': shape and dtype {} need {} bytes but data_offsets "
                     "span {}",
                     name, code, uint64_t(std::min<unsigned __int128>(bytes, ~0ull)), end - begin));
  return {name, dt, std::move(shape), begin, end};
}

}  // namespace

bool File::has(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const at::Tensor& File::get(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  fail(label, fmt::format("missing tensor '{}'", name));
}

const std::string& File::meta(const std::string& key) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) fail(label, fmt::format("missing metadata key '{}'", key));
  return it->second;
}

File parse(const std::string& bytes, const std::string& label) {
  if (bytes.size() < 8)
    fail(label,
         fmt::format("truncated: {} bytes, too short for the 8-byte header length", bytes.size()));
  const uint64_t n = read_u64_le(bytes);
  if (n > kMaxHeaderBytes)
    fail(label, fmt::format("header length {} exceeds the {} byte limit", n, kMaxHeaderBytes));
  if (n > bytes.size() - 8)
    fail(label,
         fmt::format("truncated: header claims {} bytes, only {} follow", n, bytes.size() - 8));
  nlohmann::ordered_json header;  // keeps the header's tensor order
  try {
    header = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + int64_t(n));
  } catch (const nlohmann::json::exception& e) {
    fail(label, fmt::format("malformed JSON header: {}", e.what()));
  }
  if (!header.is_object()) fail(label, "malformed header: not a JSON object");

  const uint64_t data_size = bytes.size() - 8 - n;
  File f;
  f.label = label;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) fail(label, "__metadata__ must be an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          fail(label, fmt::format("__metadata__.{} must be a string", m.key()));
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(it.key(), it.value(), data_size, label));
  }
  // Overlap check on the sorted ranges (empty tensors overlap nothing).
  std::vector<const Entry*> by_begin;
  for (const auto& e : entries)
    if (e.end > e.begin) by_begin.push_back(&e);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i)
    if (by_begin[i]->begin < by_begin[i - 1]->end)
      fail(label, fmt::format("tensors '{}' and '{}' have overlapping data_offsets",
                              by_begin[i - 1]->name, by_begin[i]->name));

  const char* data = bytes.data() + 8 + n;
  for (const auto& e : entries) {
    if (e.dtype->type == at::kBool)
      for (uint64_t i = e.begin; i < e.end; ++i)
        if (uint8_t(data[i]) > 1)
          fail(label, fmt::format("tensor '{}': BOOL byte {} is {}, not 0 or 1", e.name,
                                  i - e.begin, int(uint8_t(data[i]))));
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    f.tensors.emplace_back(e.name, std::move(t));
  }
  return f;
}

File read(const std::string& path) {
  return parse(read_whole_file<SafetensorsError>(path, "file"), path);
}

std::string dtype_code(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.code;
  throw SafetensorsError(fmt::format("dtype {} has no safetensors code", at::toString(t)));
}

std::string serialize(const NamedTensors& tensors, const Metadata& metadata) {
  // An object even with no tensors and no metadata ("{}", not "null": found
  // by fuzz_safetensors' round trip).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<at::Tensor> contiguous;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw SafetensorsError("'__metadata__' is not a tensor name");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = uint64_t(c.numel()) * c.element_size();
    header[name] = {{"dtype", dtype_code(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& c : contiguous)
    out.append(static_cast<const char*>(c.data_ptr()), uint64_t(c.numel()) * c.element_size());
  return out;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, fmt::format("cannot open '{}' for writing", tmp));
    out.write(bytes.data(), int64_t(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail(path, "write failed (disk full?)");
    }
  }
  fsync_path(tmp);  // the bytes reach the disk before the name does
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, fmt::format("cannot rename '{}' into place", tmp));
  }
}

void write(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  write_file_atomic(path, serialize(tensors, metadata));
}

}  // namespace dflash::safetensors
