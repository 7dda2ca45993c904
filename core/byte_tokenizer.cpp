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

const char* const kByteChatTemplate =
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

namespace {

// GPT-2's byte-to-character map (the ByteLevel pre-tokenizer's alphabet):
// printable Latin-1 bytes map to themselves, the other 68 to U+0100 on.
std::string byte_level_char(int b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
    cp = 256 + n;
  }
  std::string s;  // UTF-8 of cp < 0x800
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

nlohmann::json added_token(int64_t id, const char* content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

}  // namespace

std::string byte_hf_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", false},
                                     {"use_regex", false}};
  const nlohmann::json j = {{"version", "1.0"},
                            {"truncation", nullptr},
                            {"padding", nullptr},
                            {"added_tokens",
                             {added_token(ByteTokenizer::kEnd, "<|endoftext|>"),
                              added_token(ByteTokenizer::kPad, "<|pad|>"),
                              added_token(ByteTokenizer::kMask, "<|mask|>")}},
                            {"normalizer", nullptr},
                            {"pre_tokenizer", byte_level},
                            {"post_processor", nullptr},
                            {"decoder", byte_level},
                            {"model",
                             {{"type", "BPE"},
                              {"dropout", nullptr},
                              {"unk_token", nullptr},
                              {"continuing_subword_prefix", nullptr},
                              {"end_of_word_suffix", nullptr},
                              {"fuse_unk", false},
                              {"byte_fallback", false},
                              {"ignore_merges", false},
                              {"vocab", vocab},
                              {"merges", nlohmann::json::array()}}}};
  return j.dump(2) + "\n";
}

std::string byte_hf_tokenizer_config_json() {
  const nlohmann::json j = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                            {"eos_token", "<|endoftext|>"},
                            {"pad_token", "<|pad|>"},
                            {"mask_token", "<|mask|>"},
                            {"model_max_length", 40960},
                            {"chat_template", kByteChatTemplate}};
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
