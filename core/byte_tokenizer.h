// The byte-level tokenizer of dflash's real-text target (fixtures/targets/
// qwen3-bytes, docs/TRAINING.md "Text data"): token id = byte value for the
// 256 bytes, then three special ids. Text files are UTF-8: the tokenizer
// itself takes any bytes, the text source checks the encoding first so a
// Latin-1 file is an error naming its offset, not silently different text.
//
//   0..255  the bytes        256  end (<|endoftext|>, between documents)
//   257     pad              258  mask (the drafter's mask token)
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflash {

struct ByteTokenizer {
  static constexpr int64_t kEnd = 256, kPad = 257, kMask = 258, kVocab = 259;

  static std::vector<int64_t> encode(const std::string& text);
  // Bytes back; a special id or one outside the vocabulary becomes its
  // readable name (see token_text), so a decoded draft never loses a slot.
  static std::string decode(const std::vector<int64_t>& ids);
  // One id for display: the byte, or "<|end|>", "<|pad|>", "<|mask|>", "<|id N|>".
  static std::string token_text(int64_t id);
};

// Byte offset of the first invalid UTF-8 sequence in `text` (overlong forms,
// surrogates and code points above U+10FFFF are invalid), or -1 when valid.
int64_t first_invalid_utf8(const std::string& text);

// The description file of a byte-tokenized Hugging Face directory
// (byte_tokenizer.json): {"type": "byte", "vocab_size", "end_token_id",
// "pad_token_id", "mask_token_id"}.
extern const char* const kByteTokenizerFile;
std::string byte_tokenizer_json();
// The same tokenizer as Hugging Face tokenizer files, so that transformers'
// AutoTokenizer (and `dflash prepare`) reads the directory: tokenizer.json
// (a byte-level BPE without merges whose ids are the byte values, the three
// specials <|endoftext|> 256, <|pad|> 257, <|mask|> 258) and
// tokenizer_config.json with a ChatML-style chat template (kByteChatTemplate):
// "<|im_start|>ROLE\nCONTENT" then <|endoftext|> (the end-of-turn token) and
// "\n" per message, the markers plain bytes.
extern const char* const kByteChatTemplate;
std::string byte_hf_tokenizer_json();
std::string byte_hf_tokenizer_config_json();
// True when `model_dir` holds one; throws std::runtime_error naming the file
// and field when it exists but disagrees with ByteTokenizer.
bool has_byte_tokenizer(const std::string& model_dir);

}  // namespace dflash
