// The text data source and the real-text target: packing keeps every byte
// exactly once; JSONL texts and directories read in order; bad text is an
// error naming file, line and offset; prompts come from the text at word
// starts; self-distillation continues them greedily; the shipped target
// directory (fixtures/targets/qwen3-bytes) loads in dflash and reproduces
// its recorded held-out bits per byte.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "core/optim.h"
#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "reference/step.h"
#include "reference/target.h"
#include "train/data.h"
#include "train/generate.h"
#include "train/hf.h"
#include "train/lm.h"
#include "train/samples.h"

namespace dflash::train {
namespace {

namespace fs = std::filesystem;
using testing_support::TmpDir;

// micro_config widened to the byte vocabulary: text needs ids 0..255 + mask.
Config byte_config(int64_t seq_len, int64_t prompt_len) {
  Config c = fixtures::micro_config();
  c.target.vocab_size = ByteTokenizer::kVocab;
  c.data = DataConfig::batch("text", 2, seq_len, 3, 3, ByteTokenizer::kMask);
  c.data.path = "unused";
  c.data.prompt_len = prompt_len;
  validate_config(c);
  return c;
}

void write(const std::string& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TextData, PackingKeepsEveryByteOnceInOrder) {
  const Config c = byte_config(8, 3);
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
  const Config c = byte_config(16, 6);
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
  Config c = byte_config(12, 5);
  c.data.source = "self_distill";
  const TargetWeights t = make_target(c);
  const std::vector<TextDoc> docs = {{"d", ByteTokenizer::encode("one two three four five six")}};
  const Dataset d = self_distill(c, t, 3, "self_distill", &docs);
  EXPECT_TRUE(at::equal(d.input_ids.narrow(1, 0, 5), text_prompts(c, docs, 3, "self_distill")));
  at::Tensor again = d.input_ids.clone();
  again.narrow(1, 5, 7).zero_();
  greedy_continue(c, t, again, 5, c.data.mask_token_id);
  EXPECT_TRUE(at::equal(again, d.input_ids));
  EXPECT_EQ(d.loss_mask.sum().item<int64_t>(), 3 * 7);
  EXPECT_NE(d.label.find("prompts from 1 text documents"), std::string::npos);
}

TEST(TextDataBadInput, ConfigRefusesAMaskTokenThatIsAByte) {
  Config c = byte_config(12, 5);
  c.data.mask_token_id = 65;
  EXPECT_NE(error_of([&] { validate_config(c); }).find("data.mask_token_id"), std::string::npos);
  c = byte_config(12, 5);
  c.target.vocab_size = 200, c.data.mask_token_id = 199;
  EXPECT_NE(error_of([&] { validate_config(c); }).find("target.vocab_size"), std::string::npos);
  c = byte_config(12, 5);  // held-out prompt text without training text: seeded prompts
  c.data.source = "self_distill", c.data.path = "", c.data.eval_path = "held.txt";
  EXPECT_NE(error_of([&] { validate_config(c); }).find("data.eval_path"), std::string::npos);
  c.data.eval_path = "", c.data.mask_token_id = 7;  // seeded prompts: any mask id
  EXPECT_EQ(error_of([&] { validate_config(c); }), "(no error)");
}

TEST(TextDataBadInput, AnHfTargetWithoutTheByteTokenizerIsRefused) {
  TmpDir dir;
  Config c = byte_config(12, 5);
  write_hf_model(dir.p.string(), c, make_target(c), 1);
  write(dir / "t.txt", "some text for the source");
  c.target.source = "hf", c.target.path = dir.p.string(), c.data.path = dir / "t.txt";
  c.data.eval_samples = 0;
  EXPECT_NE(error_of([&] { load_data(c, nullptr); }).find("no byte_tokenizer.json"),
            std::string::npos);
  write(dir / kByteTokenizerFile, byte_tokenizer_json());
  EXPECT_EQ(load_data(c, nullptr).train.size(), 2);  // 24 bytes in rows of 12
}

// The report's draft samples count acceptance exactly as the step's tau
// does (SPEC step 10): a drafter fitted to a few held-out rows (so that its
// proposals often agree) is asked for samples, and the same anchors through
// the step give the same per-slot hits and the same accepted total.
TEST(DraftSamples, AgreeWithTheStepsTauOnTheSameAnchors) {
  Config c = byte_config(16, 5);
  c.data.source = "self_distill";
  const TargetWeights t = make_target(c);
  const FrozenWeights f = t.frozen();
  const std::vector<TextDoc> docs = {
      {"d", ByteTokenizer::encode("the cat sat on the mat and the dog sat on the log")}};
  const Dataset eval = self_distill(c, t, 4, "e", &docs);
  DrafterWeights w = make_drafter(c);
  const SampleSource src{&c, reference::drafter_step, &w, &f, &t};
  nlohmann::json got = draft_samples(src, eval, 4, 3);
  ASSERT_EQ(got["samples"].size(), 4u);
  const int64_t N = int64_t(got["samples"][0]["blocks"].size());
  StepInputs in{eval.input_ids, eval.loss_mask, {}, {}, {}};
  std::vector<int64_t> anchors;
  for (const auto& smp : got["samples"]) {
    ASSERT_EQ(int64_t(smp["blocks"].size()), N);
    for (const auto& b : smp["blocks"]) anchors.push_back(b["anchor"].get<int64_t>());
  }
  in.anchors = {at::tensor(anchors, at::kLong).view({4, N}), at::ones({4, N}, at::kBool)};
  const reference::TargetOutputs tf = reference::target_forward(c, t, in.input_ids);
  in.features = tf.features, in.target_hidden = tf.final_hidden;
  OptimConfig oc;
  oc.lr = 3e-2;
  AdamW opt(named(w), oc);
  for (int step = 0; step < 80; ++step) {  // fit the rows: proposals then often agree
    run_step(reference::drafter_step, c, w, f, in);
    opt.step();
  }
  got = draft_samples(src, eval, 4, 3);
  const StepOutputs out = reference::drafter_step(c, w, f, in);
  int64_t accepted = 0;
  std::vector<int64_t> hits(size_t(c.data.block_size), 0);
  for (const auto& smp : got["samples"])
    for (const auto& b : smp["blocks"]) {
      accepted += b["accepted"].get<int64_t>();
      for (size_t k = 0; k < b["proposal"].size(); ++k)
        hits[k + 1] += b["proposal"][k] == b["target"][k];
    }
  EXPECT_GT(accepted, 4) << "the fitted drafter should agree often; the test needs it";
  EXPECT_EQ(accepted, out.accept_sum.item<int64_t>());
  for (int64_t k = 1; k < c.data.block_size; ++k)
    EXPECT_EQ(hits[size_t(k)], out.correct[k].item<int64_t>()) << "slot " << k;
}

// `dflash train-target` refuses unusable options before reading or writing.
TEST(TrainTargetBadInput, OptionsAreCheckedNamingTheFlag) {
  LmRecipe r;
  r.out = "/nonexistent/never-written";
  r.steps = 0;
  EXPECT_NE(
      error_of([&] { train_byte_lm(r); }).find("--steps: expected a positive integer, found 0"),
      std::string::npos);
  r.steps = 10, r.holdout = "/usr/share/common-licenses/Apache-2.0";
  EXPECT_NE(error_of([&] { train_byte_lm(r); }).find("--holdout: expected a file name"),
            std::string::npos);
  r.holdout = "Apache-2.0", r.lr = 0;
  EXPECT_NE(error_of([&] { train_byte_lm(r); }).find("--lr: expected in (0, 1)"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(r.out));
}

// The shipped real-text target: its config.json, tokenizer and weights load
// through dflash's Hugging Face path, and dflash's reference forward gives
// the held-out bits per byte recorded when it was trained.
TEST(RealTextTarget, LoadsAndReproducesItsHeldOutBitsPerByte) {
  const std::string dir = testing_support::source_dir() + "/fixtures/targets/qwen3-bytes";
  const nlohmann::json result =
      nlohmann::json::parse(read_whole_file(dir + "/result.json", "result.json"));
  const TargetConfig t = read_hf_config(dir);
  EXPECT_EQ(t.vocab_size, ByteTokenizer::kVocab);
  EXPECT_TRUE(has_byte_tokenizer(dir));
  const std::string held = result["recipe"]["corpus"].get<std::string>() + "/" +
                           result["recipe"]["holdout"].get<std::string>();
  if (!fs::exists(held)) GTEST_SKIP() << held << " is not on this machine (Debian's base-files)";
  const double bpb = byte_lm_bits_per_byte(dir, held, result["recipe"]["seq_len"].get<int64_t>());
  // The figure was recorded by this same float32 code; 1e-3 leaves room only
  // for another CPU's reduction order (here the two agree exactly).
  EXPECT_NEAR(bpb, result["heldout_bits_per_byte"].get<double>(), 1e-3);
  EXPECT_LT(bpb, 0.6 * result["unigram_bits_per_byte"].get<double>()) << "not a language model";
}

}  // namespace
}  // namespace dflash::train
