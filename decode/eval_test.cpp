// `dflash eval`'s inputs and the served report: a drafter config that
// disagrees with the target is refused naming the field, prompt files, the
// report's counts add up and a drafter that has learned the target's text
// is served better than a random one.
#include "decode/eval.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "decode/served_eval.h"
#include "decode/speculative_test_support.h"
#include "fixtures/fixtures.h"
#include "models/checkpoint.h"
#include "reference/step.h"

namespace dflash::decode {
namespace {
namespace fs = std::filesystem;

std::string refusal(const nlohmann::json& d, const TargetConfig& t, const std::string& dir,
                    int64_t bs = 0) {
  try {
    check_drafter_config(d, "CK/config.json", t, dir, bs);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Eval, DrafterConfigDisagreeingWithTheTargetIsRefusedNamingTheField) {
  const Config c = testing::small_config();
  const nlohmann::json good = models::drafter_config_json(c);
  EXPECT_EQ(refusal(good, c.target, ""), "accepted");
  EXPECT_EQ(refusal(good, c.target, "", 4), "accepted");
  auto with = [&](const nlohmann::json::json_pointer& p, const nlohmann::json& v) {
    nlohmann::json d = good;
    d[p] = v;
    return refusal(d, c.target, "");
  };
  using P = nlohmann::json::json_pointer;
  EXPECT_NE(with(P("/hidden_size"), 32)
                .find("CK/config.json: hidden_size: 32 disagrees with the "
                      "target (16)"),
            std::string::npos);
  EXPECT_NE(with(P("/vocab_size"), 30).find("vocab_size: 30 disagrees"), std::string::npos);
  EXPECT_NE(with(P("/num_target_layers"), 5).find("num_target_layers: 5"), std::string::npos);
  EXPECT_NE(with(P("/dflash_config/target_layer_ids"), {0, 2})
                .find("dflash_config.target_layer_ids: expected layer ids in [0, 2)"),
            std::string::npos);
  EXPECT_NE(with(P("/dflash_config/target_layer_ids"), {1, 0})
                .find("dflash_config.target_layer_ids: expected distinct ids in ascending order"),
            std::string::npos);
  EXPECT_NE(with(P("/dflash_config/target_layer_ids"), {0, 0}).find("found [0, 0]"),
            std::string::npos);
  EXPECT_NE(with(P("/dflash_config/mask_token_id"), 24)
                .find("dflash_config.mask_token_id: 24 is outside the target's vocabulary"),
            std::string::npos);
  EXPECT_NE(refusal(good, c.target, "", 5)
                .find("block_size: the drafter was trained with blocks "
                      "of 4; --block-size 5"),
            std::string::npos);
  nlohmann::json no_mask = good;
  no_mask["dflash_config"].erase("mask_token_id");
  EXPECT_NE(refusal(no_mask, c.target, "")
                .find("CK/config.json: dflash_config.mask_token_id: expected an integer"),
            std::string::npos);
  nlohmann::json no_df = good;
  no_df.erase("dflash_config");
  EXPECT_NE(refusal(no_df, c.target, "").find("dflash_config: missing"), std::string::npos);
  // The shipped byte-level target: its tokenizer's mask is 258.
  const std::string bytes = "fixtures/targets/qwen3-bytes";
  const TargetConfig bt = read_hf_config(bytes);
  Config cb = c;
  cb.target = bt, cb.drafter.shape.hidden_size = bt.shape.hidden_size;
  cb.drafter.target_layer_ids = {1, 2}, cb.data.mask_token_id = 258;
  nlohmann::json d = models::drafter_config_json(cb);
  EXPECT_EQ(refusal(d, bt, bytes), "accepted");
  d["dflash_config"]["mask_token_id"] = 257;
  EXPECT_NE(refusal(d, bt, bytes)
                .find("mask_token_id: 257 disagrees with the target's byte "
                      "tokenizer"),
            std::string::npos);
  EXPECT_EQ(bt.max_position_embeddings, 40960);  // the served context limit
}

struct TmpFile {
  fs::path path;
  TmpFile(const std::string& name, const std::string& text)
      : path(fs::temp_directory_path() / ("dflash-eval-test-" + name)) {
    std::ofstream(path) << text;
  }
  ~TmpFile() { fs::remove(path); }
};

std::string prompt_error(const std::string& name, const std::string& text, bool bytes) {
  TmpFile f(name, text);
  try {
    read_prompt_file(f.path.string(), bytes, 259);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Eval, PromptFilesAreReadOrRefusedNamingTheLine) {
  TmpFile txt("p.txt", "Hello\n\n  \nworld\n");
  EXPECT_EQ(
      read_prompt_file(txt.path.string(), true, 259),
      (std::vector<std::vector<int64_t>>{{'H', 'e', 'l', 'l', 'o'}, {'w', 'o', 'r', 'l', 'd'}}));
  TmpFile js("p.jsonl", "{\"text\": \"ab\"}\n{\"ids\": [1, 258]}\n{\"input_ids\": [5]}\n");
  EXPECT_EQ(read_prompt_file(js.path.string(), true, 259),
            (std::vector<std::vector<int64_t>>{{'a', 'b'}, {1, 258}, {5}}));
  EXPECT_NE(prompt_error("f.jsonl", "{\"input_ids\": [259]}\n", true)
                .find(":1: input_ids: 259 is not a token id"),
            std::string::npos);
  EXPECT_NE(
      prompt_error("a.jsonl", "{\"ids\": [1, 259]}\n", true).find(":1: ids: 259 is not a token id"),
      std::string::npos);
  EXPECT_NE(prompt_error("b.txt", "x\nab\xff\n", true).find(":2: invalid UTF-8 at byte 2"),
            std::string::npos);
  EXPECT_NE(prompt_error("c.txt", "text\n", false).find(":1: a text prompt needs a byte-tokenized"),
            std::string::npos);
  EXPECT_NE(prompt_error("d.txt", "\n\n", true).find("no prompts"), std::string::npos);
  EXPECT_NE(prompt_error("e.jsonl", "[1]\n", true).find(":1: not a JSON object"),
            std::string::npos);
}

// The report's counts are consistent, with and without a stop token (a
// round that accepts it commits no bonus token); budget 1 is the block
// figure exactly.
TEST(Eval, ServedReportCountsAddUp) {
  Config c = testing::small_config();
  const TargetWeights t = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10}};
  ServedOptions o;
  o.block_size = 4, o.max_new_tokens = 20, o.max_context = 64, o.budgets = {1, 8};
  const ServedReport r = served_eval({&c, &t, &w, reference::drafter_step}, prompts, o);
  EXPECT_EQ(r.block.tokens, 60);
  EXPECT_EQ(r.greedy_tokens, 60);
  EXPECT_EQ(r.block.mismatched_prompts, 0);
  int64_t rounds = 0, committed = 0;
  for (size_t j = 0; j < r.block.histogram.size(); ++j)
    rounds += r.block.histogram[j], committed += int64_t(j + 1) * r.block.histogram[j];
  EXPECT_EQ(rounds, r.block.full_rounds);
  EXPECT_EQ(committed, r.block.committed);
  EXPECT_EQ(r.block.reached[0], r.block.full_rounds - r.block.histogram[0]);
  EXPECT_EQ(r.block.target_forwards, 3 + r.block.rounds);  // prefill + one per round
  EXPECT_DOUBLE_EQ(r.trees[0].acceptance(), r.block.acceptance());
  EXPECT_GE(r.trees[1].nodes, r.trees[0].nodes);
  EXPECT_EQ(r.tau_accuracy.size(), 4u);
  EXPECT_NE(r.text().find("served acceptance (block 4)"), std::string::npos);
}

// Hand-computed: rounds accepting 2, 0 and 3 of 3 proposals, then one
// shortened round, the third round accepting the stop token (no bonus).
TEST(Eval, ServedCountsByHand) {
  DecodeResult r;
  r.accepted = {2, 0, 3}, r.slots = {3, 3, 3}, r.nodes = {3, 3, 3};
  r.tokens.resize(8), r.target_forwards = 4, r.stopped = true;
  ServedRun run;
  add_decode(run, r, 4);
  EXPECT_EQ(run.full_rounds, 3);
  EXPECT_EQ(run.committed, 3 + 1 + 3);
  EXPECT_EQ(run.histogram, (std::vector<int64_t>{1, 0, 2, 0}));
  EXPECT_EQ(run.reached, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_DOUBLE_EQ(run.acceptance(), 7.0 / 3.0);
  r.accepted.push_back(1), r.slots.push_back(2), r.nodes.push_back(2), r.stopped = false;
  ServedRun run2;
  add_decode(run2, r, 4);
  EXPECT_EQ(run2.full_rounds, 3);
  EXPECT_EQ(run2.committed, 3 + 1 + 4);  // the short round is left out, the stop is not last
  EXPECT_EQ(run2.rounds, 4);
  EXPECT_EQ(run2.nodes, 11);
}

}  // namespace
}  // namespace dflash::decode
