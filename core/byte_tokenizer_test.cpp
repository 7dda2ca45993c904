// The byte tokenizer: every byte round-trips, specials decode to their
// names, the UTF-8 check finds the first bad sequence of each invalid class,
// and the description file is read back and refused when it disagrees.
#include "core/byte_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "fixtures/test_support.h"

namespace dflash {
namespace {

TEST(ByteTokenizer, EveryByteRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  const std::vector<int64_t> ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
  const std::string utf8 = "na\xC3\xAFve \xE2\x82\xAC \xF0\x9F\x98\x80";  // naive, euro, emoji
  EXPECT_EQ(ByteTokenizer::encode(utf8).size(), utf8.size());
  EXPECT_EQ(ByteTokenizer::decode(ByteTokenizer::encode(utf8)), utf8);
}

TEST(ByteTokenizer, SpecialIdsDecodeToTheirNames) {
  EXPECT_EQ(ByteTokenizer::decode({'a', ByteTokenizer::kMask, 'b'}), "a<|mask|>b");
  EXPECT_EQ(ByteTokenizer::token_text(ByteTokenizer::kEnd), "<|end|>");
  EXPECT_EQ(ByteTokenizer::token_text(ByteTokenizer::kPad), "<|pad|>");
  EXPECT_EQ(ByteTokenizer::token_text(300), "<|id 300|>");
  EXPECT_EQ(ByteTokenizer::token_text(-1), "<|id -1|>");
}

TEST(ByteTokenizer, FirstInvalidUtf8) {
  EXPECT_EQ(first_invalid_utf8(""), -1);
  EXPECT_EQ(first_invalid_utf8("plain ASCII\n"), -1);
  EXPECT_EQ(first_invalid_utf8("\xC3\xA9\xE2\x82\xAC\xF4\x8F\xBF\xBF"), -1);  // up to U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ab\xE9z"), 2);                                // Latin-1 e-acute
  EXPECT_EQ(first_invalid_utf8("a\x80"), 1);                                  // stray continuation
  EXPECT_EQ(first_invalid_utf8("abc\xC0\x80"), 3);                            // overlong NUL
  EXPECT_EQ(first_invalid_utf8("\xE0\x80\xAF"), 0);                           // overlong '/'
  EXPECT_EQ(first_invalid_utf8("x\xED\xA0\x80"), 1);                          // surrogate U+D800
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0);                       // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ok\xE2\x82"), 2);            // truncated at the end
  EXPECT_EQ(first_invalid_utf8("\xF8\x88\x80\x80\x80"), 0);  // 5-byte form
}

TEST(ByteTokenizer, DescriptionFileIsReadAndCheckedByField) {
  testing_support::TmpDir dir;
  EXPECT_FALSE(has_byte_tokenizer(dir.p.string()));  // none: not a byte model
  const auto write = [&](const std::string& text) {
    std::ofstream(dir / kByteTokenizerFile) << text;
  };
  write(byte_tokenizer_json());
  EXPECT_TRUE(has_byte_tokenizer(dir.p.string()));
  std::string wrong = byte_tokenizer_json();
  const std::string field = "\"mask_token_id\": 258";
  ASSERT_NE(wrong.find(field), std::string::npos);
  wrong.replace(wrong.find(field), field.size(), "\"mask_token_id\": 255");
  write(wrong);
  try {
    has_byte_tokenizer(dir.p.string());
    ADD_FAILURE() << "a wrong mask id was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("mask_token_id: expected 258, found 255"),
              std::string::npos)
        << e.what();
  }
  write("{\"type\": \"bpe\"}");
  EXPECT_THROW(has_byte_tokenizer(dir.p.string()), std::runtime_error);
  write("{\"type\": 5}");  // not a string: still an error naming the file
  try {
    has_byte_tokenizer(dir.p.string());
    ADD_FAILURE() << "a numeric type was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("byte_tokenizer.json: type:"), std::string::npos);
  }
  write("not json");
  EXPECT_THROW(has_byte_tokenizer(dir.p.string()), std::runtime_error);
}

// The shipped target's Hugging Face tokenizer files are what `dflash
// train-target` writes (byte_hf_tokenizer_json / _config_json): the same
// JSON, so a regenerated target keeps its chat template (transformers'
// loading of them is python.prepare's test).
TEST(ByteTokenizer, ShippedHfTokenizerFilesAreTheWriters) {
  const std::string dir = testing_support::source_dir() + "/fixtures/targets/qwen3-bytes/";
  for (const auto& [file, text] :
       {std::pair<std::string, std::string>{"tokenizer.json", byte_hf_tokenizer_json()},
        {"tokenizer_config.json", byte_hf_tokenizer_config_json()}}) {
    std::ifstream in(dir + file);
    ASSERT_TRUE(in) << dir + file;
    const nlohmann::json shipped = nlohmann::json::parse(in);
    EXPECT_EQ(shipped, nlohmann::json::parse(text)) << file;
  }
  const nlohmann::json tj = nlohmann::json::parse(byte_hf_tokenizer_json());
  for (int b = 0; b < 256; ++b) {  // every byte once, its id its value
    int seen = 0;
    for (const auto& [k, v] : tj["model"]["vocab"].items()) seen += v == b;
    EXPECT_EQ(seen, 1) << b;
  }
  EXPECT_EQ(tj["model"]["vocab"].size(), 256u);
}

}  // namespace
}  // namespace dflash
