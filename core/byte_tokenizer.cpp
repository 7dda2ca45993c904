#include "core/byte_tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/safetensors.h"

namespace dflash {

const char* const kByteTokenizerFile = "byte_tokenizer.json";

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int64_t(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string ByteTokenizer::token_text(int64_t id) {
  if (id >= 0 && id < 256) return std::string(1, char(static_cast<unsigned char>(id)));
  if (id == kEnd) return "<|end|>";
  if (id == kPad) return "<|pad|>";
  if (id == kMask) return "<|mask|>";
  return fmt::format("<|id {}|>", id);
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += token_text(id);
  return out;
}

int64_t first_invalid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = s[i];
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07, min = 0x10000;
    } else {
      return int64_t(i);  // a continuation byte or 0xF8..0xFF where a sequence starts
    }
    if (i + len > n) return int64_t(i);
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return int64_t(i);
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return int64_t(i);
    i += len;
  }
  return -1;
}

std::string byte_tokenizer_json() {
  const nlohmann::json j = {{"type", "byte"},
                            {"vocab_size", ByteTokenizer::kVocab},
                            {"end_token_id", ByteTokenizer::kEnd},
                            {"pad_token_id", ByteTokenizer::kPad},
                            {"mask_token_id", ByteTokenizer::kMask},
                            {"note", "token id = byte value for 0..255; UTF-8 text"}};
  return j.dump(2) + "\n";
}

bool has_byte_tokenizer(const std::string& model_dir) {
  const std::string file = (std::filesystem::path(model_dir) / kByteTokenizerFile).string();
  if (!std::filesystem::exists(file)) return false;
  const nlohmann::json j =
      nlohmann::json::parse(read_whole_file(file, kByteTokenizerFile), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::runtime_error(fmt::format("{}: not a valid JSON object", file));
  const auto type = j.find("type");
  if (type == j.end() || !type->is_string() || type->get<std::string>() != "byte")
    throw std::runtime_error(fmt::format("{}: type: expected \"byte\", found {}", file,
                                         type == j.end() ? "nothing" : type->dump()));
  const std::pair<const char*, int64_t> want[] = {{"vocab_size", ByteTokenizer::kVocab},
                                                  {"end_token_id", ByteTokenizer::kEnd},
                                                  {"pad_token_id", ByteTokenizer::kPad},
                                                  {"mask_token_id", ByteTokenizer::kMask}};
  for (const auto& [key, value] : want) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() != value)
      throw std::runtime_error(fmt::format("{}: {}: expected {}, found {}", file, key, value,
                                           it == j.end() ? "nothing" : it->dump()));
  }
  return true;
}

}  // namespace dflash
