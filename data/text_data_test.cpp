// The text data source: packing keeps every byte exactly once; JSONL texts
// and directories read in order; bad text is an error naming file, line and
// offset; prompts come from the text at word starts; self-distillation
// continues them greedily.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/byte_tokenizer.h"
#include "core/init.h"
#include "data/data.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "models/generate.h"
#include "models/hf.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
using testing_support::error_of;
using testing_support::TmpDir;

void write(const std::string& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
}

TEST(TextData, PackingKeepsEveryByteOnceInOrder) {
  const Config c = fixtures::byte_text_config(8, 3);
  const std::vector<TextDoc> docs = {{"a", ByteTokenizer::encode("x")},
                                     {"b", ByteTokenizer::encode("exactly8")},
                                     {"c", ByteTokenizer::encode("nine byte")},
                                     {"d", ByteTokenizer::encode("nineteen bytes long")}};
  const Dataset d = pack_text(c, docs, "docs");
  ASSERT_EQ(d.size(), 1 + 1 + 2 + 3);  // ceil(n / 8) rows per document
  std::string kept;
  for (int64_t r = 0; r < d.size(); ++r)
    for (int64_t s = 0; s < 8; ++s) {
      if (d.loss_mask[r][s].item<bool>())
        kept += char(d.input_ids[r][s].item<int64_t>());
      else
        EXPECT_EQ(d.input_ids[r][s].item<int64_t>(), 0) << "padding is token 0";
    }
  EXPECT_EQ(kept, "xexactly8nine bytenineteen bytes long");
  // A row never mixes documents: document c starts a fresh row.
  EXPECT_EQ(d.input_ids[2][0].item<int64_t>(), 'n');
  EXPECT_TRUE(d.loss_mask[2].all().item<bool>());
  EXPECT_EQ(d.loss_mask[3].sum().item<int64_t>(), 1);  // "e" of "byte"
}

TEST(TextData, ReadsFilesJsonlAndDirectoriesInNameOrder) {
  TmpDir dir;
  write(dir / "b.txt", "second file");
  write(dir / "a.jsonl", "{\"text\": \"first\"}\n\n{\"text\": \"caf\\u00e9\"}\n");
  write(dir / "held.txt", "held out");
  fs::create_symlink(dir / "b.txt", dir / "link");  // skipped: not a second copy
  const std::vector<TextDoc> docs = read_text_documents(dir.p.string(), dir / "held.txt");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].name, (dir / "a.jsonl") + ":1");
  EXPECT_EQ(docs[1].name, (dir / "a.jsonl") + ":3");
  EXPECT_EQ(ByteTokenizer::decode(docs[1].ids), "caf\xC3\xA9");
  EXPECT_EQ(ByteTokenizer::decode(docs[2].ids), "second file");
  EXPECT_EQ(read_text_documents(dir / "held.txt").size(), 1u);
}

TEST(TextDataBadInput, ErrorsNameFileLineAndOffset) {
  TmpDir dir;
  write(dir / "latin1.txt", "caf\xE9 au lait");
  EXPECT_NE(error_of([&] {
              read_text_documents(dir / "latin1.txt");
            }).find("latin1.txt: byte offset 3: not valid UTF-8"),
            std::string::npos);
  write(dir / "empty.txt", "");
  EXPECT_NE(error_of([&] { read_text_documents(dir / "empty.txt"); }).find("empty.txt: empty file"),
            std::string::npos);
  write(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"input_ids\": [1]}\n");
  EXPECT_NE(error_of([&] {
              read_text_documents(dir / "bad.jsonl");
            }).find("bad.jsonl:2: text: expected a string, found nothing"),
            std::string::npos);
  write(dir / "blank.jsonl", "{\"text\": \"\"}\n");
  EXPECT_NE(
      error_of([&] { read_text_documents(dir / "blank.jsonl"); }).find("blank.jsonl:1: empty"),
      std::string::npos);
  EXPECT_NE(error_of([&] { read_text_documents(dir / "missing"); }).find("no such text file"),
            std::string::npos);
  write(dir / "latin1.jsonl", "{\"text\": \"caf\xE9\"}\n");  // JSON would call it malformed
  EXPECT_NE(error_of([&] {
              read_text_documents(dir / "latin1.jsonl");
            }).find("latin1.jsonl:1: byte offset 13 of the line: not valid UTF-8"),
            std::string::npos);
}

TEST(TextData, PromptsComeFromTheTextAtWordStarts) {
  const Config c = fixtures::byte_text_config(16, 6);
  const std::string text = "alpha beta gamma delta epsilon zeta eta theta iota kappa";
  const std::vector<TextDoc> docs = {{"short", ByteTokenizer::encode("tiny")},
                                     {"long", ByteTokenizer::encode(text)}};
  int64_t skipped = -1;
  const at::Tensor p = text_prompts(c, docs, 40, "s", &skipped);  // (40, 6)
  EXPECT_EQ(skipped, 1);
  for (int64_t r = 0; r < 40; ++r) {
    std::vector<int64_t> ids(p[r].data_ptr<int64_t>(), p[r].data_ptr<int64_t>() + 6);
    const std::string s = ByteTokenizer::decode(ids);
    const size_t at = text.find(s);
    ASSERT_NE(at, std::string::npos) << s;
    EXPECT_TRUE(at == 0 || text[at - 1] == ' ' || at + 6 > text.rfind(' ')) << "mid-word: " << s;
  }
  EXPECT_TRUE(at::equal(p, text_prompts(c, docs, 40, "s")));  // a pure function of the seed
  EXPECT_FALSE(at::equal(p, text_prompts(c, docs, 40, "other")));
  EXPECT_NE(error_of([&] {
              text_prompts(c, {docs[0]}, 1, "s");
            }).find("shorter than data.prompt_len = 6"),
            std::string::npos);
}

TEST(TextData, SelfDistillContinuesTextPromptsGreedily) {
  Config c = fixtures::byte_text_config(12, 5);
  c.data.source = "self_distill";
  const TargetWeights t = make_target(c);
  const std::vector<TextDoc> docs = {{"d", ByteTokenizer::encode("one two three four five six")}};
  const Dataset d = self_distill(c, t, 3, "self_distill", &docs);
  EXPECT_TRUE(at::equal(d.input_ids.narrow(1, 0, 5), text_prompts(c, docs, 3, "self_distill")));
  at::Tensor again = d.input_ids.clone();
  again.narrow(1, 5, 7).zero_();
  models::greedy_continue(c, t, again, 5, c.data.mask_token_id);
  EXPECT_TRUE(at::equal(again, d.input_ids));
  EXPECT_EQ(d.loss_mask.sum().item<int64_t>(), 3 * 7);
  EXPECT_NE(d.label.find("prompts from 1 text documents"), std::string::npos);
}

TEST(TextDataBadInput, ConfigRefusesAMaskTokenThatIsAByte) {
  Config c = fixtures::byte_text_config(12, 5);
  c.data.mask_token_id = 65;
  EXPECT_NE(error_of([&] { validate_config(c); }).find("data.mask_token_id"), std::string::npos);
  c = fixtures::byte_text_config(12, 5);
  c.target.vocab_size = 200, c.data.mask_token_id = 199;
  EXPECT_NE(error_of([&] { validate_config(c); }).find("target.vocab_size"), std::string::npos);
  // Held-out prompt text without training text: seeded prompts.
  c = fixtures::byte_text_config(12, 5);
  c.data.source = "self_distill", c.data.path = "", c.data.eval_path = "held.txt";
  EXPECT_NE(error_of([&] { validate_config(c); }).find("data.eval_path"), std::string::npos);
  c.data.eval_path = "", c.data.mask_token_id = 7;  // seeded prompts: any mask id
  EXPECT_EQ(error_of([&] { validate_config(c); }), "(no error)");
}

TEST(TextDataBadInput, AnHfTargetWithoutTheByteTokenizerIsRefused) {
  TmpDir dir;
  Config c = fixtures::byte_text_config(12, 5);
  models::write_hf_model(dir.p.string(), c, make_target(c), 1);
  write(dir / "t.txt", "some text for the source");
  c.target.source = "hf", c.target.path = dir.p.string(), c.data.path = dir / "t.txt";
  c.data.eval_samples = 0;
  EXPECT_NE(error_of([&] { load_data(c, nullptr); }).find("no byte_tokenizer.json"),
            std::string::npos);
  write(dir / kByteTokenizerFile, byte_tokenizer_json());
  EXPECT_EQ(load_data(c, nullptr).train.size(), 2);  // 24 bytes in rows of 12
}

}  // namespace
}  // namespace dflash::data
