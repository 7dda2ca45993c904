// Hugging Face directories and checkpoints, in process: directories written
// here (sharded and unsharded, tied and untied) load back exactly; every
// bad-input class is a clear error naming the file and the field; the
// checkpoint format (inference config.json, no frozen tensors) and the
// refusal of a checkpoint from a different config; the KV-cached greedy
// continuation against whole-prefix forwards.
#include "models/hf.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/init.h"
#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "models/checkpoint.h"
#include "models/generate.h"
#include "reference/target.h"
namespace dflash::models {
namespace {

namespace fs = std::filesystem;
using testing_support::expect_error;
using testing_support::TmpDir;

// A Llama 3 target: no q/k norm, llama3 RoPE (original 8 with head_dim 8
// and theta 1e4: kept, interpolated and slowed frequencies all occur).
Config as_llama(Config c) {
  c.target.architecture = "llama";
  c.target.shape.qk_norm = false;
  c.target.shape.rope_theta = 1e4;
  c.target.shape.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8};
  return c;
}

Config hf_config(bool tied, bool llama = false) {
  Config c = fixtures::micro_config();
  c.target.tie_word_embeddings = tied;
  return llama ? as_llama(c) : c;
}

struct HfCase {
  const char* name;
  int shards;
  bool tied;
  bool llama = false;
};
class HfDirectory : public ::testing::TestWithParam<HfCase> {};

TEST_P(HfDirectory, LoadsWhatWasWritten) {
  TmpDir tmp;
  Config c = hf_config(GetParam().tied, GetParam().llama);
  const TargetWeights w = make_target(c);
  write_hf_model(tmp / "model", c, w, GetParam().shards);
  // The TOML names only the directory; the shape comes from config.json.
  std::ofstream(tmp / "run.toml") << "[target]\nsource = \"hf\"\npath = \"" << (tmp / "model")
                                  << "\"\n[drafter]\nnum_hidden_layers = 2\ntarget_layer_ids = "
                                     "[1, 2]\n[data]\nbatch_size = 2\nseq_len = 12\nblock_size = "
                                     "3\nmax_anchors = 3\nmask_token_id = 31\n[run]\ndtype = "
                                     "\"float64\"\n";
  const Config loaded = load_config(tmp / "run.toml");
  EXPECT_EQ(loaded.target.shape.hidden_size, c.target.shape.hidden_size);
  EXPECT_EQ(loaded.target.tie_word_embeddings, GetParam().tied);
  EXPECT_EQ(loaded.target.architecture, c.target.architecture);
  EXPECT_EQ(loaded.target.shape.qk_norm, c.target.shape.qk_norm);
  EXPECT_EQ(loaded.target.shape.rope_scaling.type, c.target.shape.rope_scaling.type);
  EXPECT_EQ(loaded.target.shape.rope_scaling.original_max_position_embeddings,
            c.target.shape.rope_scaling.original_max_position_embeddings);
  EXPECT_TRUE(loaded.drafter.shape.qk_norm);  // the drafter stays Qwen3-style
  EXPECT_EQ(loaded.drafter.shape.rope_scaling.type, "");
  const TargetWeights got = load_target(loaded);
  TargetWeights a = w, b = got;
  std::vector<std::pair<std::string, at::Tensor>> wa, wb;
  visit(a, [&](const std::string& n, at::Tensor& t) { wa.emplace_back(n, t); });
  visit(b, [&](const std::string& n, at::Tensor& t) { wb.emplace_back(n, t); });
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
  if (GetParam().tied) {
    EXPECT_TRUE(got.lm_head.is_same(got.embed_tokens));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HfDirectory,
                         ::testing::Values(HfCase{"unsharded_untied", 1, false},
                                           HfCase{"unsharded_tied", 1, true},
                                           HfCase{"sharded_untied", 3, false},
                                           HfCase{"sharded_tied", 2, true},
                                           HfCase{"llama_unsharded_untied", 1, false, true},
                                           HfCase{"llama_sharded_tied", 2, true, true}),
                         [](const auto& i) { return std::string(i.param.name); });

// A written model with one edit, then loaded through a config.
struct BrokenHf {
  TmpDir tmp;
  Config c = hf_config(false);
  BrokenHf(int shards) {
    write_hf_model(tmp / "m", c, make_target(c), shards);
    c.target.source = "hf", c.target.path = tmp / "m";
  }
  nlohmann::json read(const std::string& f) {
    nlohmann::json j;
    std::ifstream(tmp / ("m/" + f)) >> j;
    return j;
  }
  void write(const std::string& f, const nlohmann::json& j) {
    std::ofstream(tmp / ("m/" + f)) << j.dump();
  }
};

TEST(HfBadInput, ArchitecturesAndModelTypeDisagree) {
  BrokenHf m(1);
  auto j = m.read("config.json");
  j["architectures"] = {"LlamaForCausalLM"};
  m.write("config.json", j);
  expect_error([&] { read_hf_config(m.c.target.path); },
               {"config.json", "model_type", "\"llama\"", "LlamaForCausalLM"});
}

// A native architecture with a RoPE dflash does not compute is refused; the
// same on a target transformers runs is its business.
TEST(HfBadInput, RopeTheForwardCannotCompute) {
  BrokenHf m(1);
  auto j = m.read("config.json");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  m.write("config.json", j);
  expect_error([&] { read_hf_config(m.c.target.path); },
               {"config.json", "rope_scaling.rope_type", "\"llama3\"", "yarn"});
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  m.write("config.json", j);
  EXPECT_EQ(read_hf_config(m.c.target.path).architecture, "mistral");
}

// Another architecture loads as a config (its sizes) and is refused by
// dflash's forward, naming the features path.
TEST(HfBadInput, ForeignArchitectureIsFeaturesOnly) {
  BrokenHf m(1);
  auto j = m.read("config.json");
  j = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
       {"model_type", "qwen3_5"},
       {"text_config", j}};
  j["text_config"]["model_type"] = "qwen3_5_text";
  j["text_config"]["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
  j["text_config"].erase("rope_theta");
  m.write("config.json", j);
  const TargetConfig t = read_hf_config(m.c.target.path);
  EXPECT_EQ(t.architecture, "qwen3_5_text");
  EXPECT_EQ(t.vocab_size, m.c.target.vocab_size);
  EXPECT_EQ(t.shape.rope_theta, 1e7);
  Config c = m.c;
  c.target = t;
  expect_error([&] { load_target(c); },
               {"qwen3_5_text", "dflash features", "data.source = \"features\""});
}

TEST(HfBadInput, ShapeMismatchNamesTheTensor) {
  BrokenHf m(1);
  Config other = m.c;
  other.target.shape.intermediate_size += 8;  // weights written for 24, config says 32
  expect_error([&] { load_hf_target(other); },
               {"model.safetensors", "mlp.gate_proj.weight", "expected shape"});
}

TEST(HfBadInput, MissingShard) {
  BrokenHf m(2);
  fs::remove(m.tmp / "m/model-00002-of-00002.safetensors");
  expect_error([&] { load_hf_target(m.c); }, {"model.safetensors.index.json", "missing shard"});
}

TEST(HfBadInput, MissingIndexEntry) {
  BrokenHf m(2);
  auto j = m.read("model.safetensors.index.json");
  j["weight_map"].erase("model.norm.weight");
  m.write("model.safetensors.index.json", j);
  expect_error([&] { load_hf_target(m.c); }, {"weight_map", "no entry for model.norm.weight"});
}

TEST(HfBadInput, TomlDisagreeingWithConfigJson) {
  BrokenHf m(1);
  std::ofstream(m.tmp / "run.toml") << "[target]\nsource = \"hf\"\npath = \"" << m.c.target.path
                                    << "\"\nhidden_size = 32\n[drafter]\nnum_hidden_layers = 1\n"
                                       "[data]\nbatch_size = 1\nseq_len = 8\nblock_size = 2\n"
                                       "max_anchors = 2\nmask_token_id = 3\n";
  expect_error([&] { load_config(m.tmp / "run.toml"); },
               {"target.hidden_size", "config.json", "32"});
}

TEST(Checkpoint, InferenceConfigAndNoFrozenTensors) {
  TmpDir tmp;
  Config c = fixtures::micro_config();
  const DrafterWeights w = make_drafter(c);
  AdamW opt(named(w), optim_config(c.train));
  const std::string dir = save_checkpoint(tmp / "run", c, w, opt, {3, 3 * c.train.micro_batches});
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  EXPECT_EQ(j["architectures"][0], "DFlashDraftModel");
  EXPECT_EQ(j["block_size"], c.data.block_size);
  EXPECT_EQ(j["dflash_config"]["mask_token_id"], c.data.mask_token_id);
  EXPECT_EQ(j["dflash_config"]["target_layer_ids"], c.drafter.target_layer_ids);
  EXPECT_EQ(j["num_hidden_layers"], c.drafter.num_hidden_layers);
  const auto f = safetensors::read(dir + "/model.safetensors");
  EXPECT_TRUE(f.has("fc.weight"));
  EXPECT_TRUE(f.has("layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(f.has("embed_tokens.weight"));
  EXPECT_FALSE(f.has("lm_head.weight"));
  EXPECT_EQ(*latest_checkpoint(tmp / "run"), dir);
}

TEST(Checkpoint, FromADifferentConfigIsRefusedNamingTheKey) {
  TmpDir tmp;
  Config c = fixtures::micro_config();
  const DrafterWeights w = make_drafter(c);
  AdamW opt(named(w), optim_config(c.train));
  const std::string dir = save_checkpoint(tmp / "run", c, w, opt, {1, c.train.micro_batches});
  Config other = c;
  other.loss.gamma += 1;
  expect_error([&] { check_same_run(read_checkpoint(dir), other); },
               {"loss.gamma", "different config"});
  Config cadence = c;
  cadence.train.log_every = 1, cadence.train.checkpoint_every = 7;  // may change on resume
  EXPECT_NO_THROW(check_same_run(read_checkpoint(dir), cadence));
  // The schedule may change (more steps, another rate): listed, not refused.
  Config longer = c;
  longer.train.steps *= 2, longer.train.lr /= 2;
  const std::vector<std::string> changed = check_same_run(read_checkpoint(dir), longer);
  ASSERT_EQ(changed.size(), 2u);
  EXPECT_EQ(changed[0].rfind("train.lr: ", 0), 0u) << changed[0];
  EXPECT_EQ(changed[1], fmt::format("train.steps: {} -> {}", c.train.steps, 2 * c.train.steps));
  EXPECT_TRUE(check_same_run(read_checkpoint(dir), cadence).empty());
  Config shorter = c;
  shorter.train.steps = 0;  // below the checkpoint's step 1
  expect_error([&] { check_same_run(read_checkpoint(dir), shorter); },
               {"train.steps 0", "below the checkpoint's step 1"});
  Config decay = c;
  decay.train.weight_decay += 0.1;  // an optimizer key, not the schedule: refused
  expect_error([&] { check_same_run(read_checkpoint(dir), decay); }, {"train.weight_decay"});
}

// The KV-cached greedy decoder chooses what a whole-prefix target forward
// chooses at every position (float64: no near-ties).
class Generate : public ::testing::TestWithParam<bool> {};

TEST_P(Generate, CachedGreedyEqualsFullPrefixForwards) {
  Config c = hf_config(false, GetParam());
  const TargetWeights t = make_target(c);
  const int64_t B = 3, S = c.data.seq_len, P = 3;
  at::Tensor ids = at::randint(0, c.target.vocab_size - 1, {B, S}, at::kLong);
  at::Tensor naive = ids.clone();
  for (int64_t s = P; s < S; ++s) {
    const at::Tensor h =
        reference::target_forward(c, t, naive.narrow(1, 0, s).contiguous()).final_hidden;
    at::Tensor logits = reference::target_logits(t, h.select(1, s - 1));
    logits.select(1, c.data.mask_token_id).fill_(-INFINITY);
    naive.select(1, s).copy_(logits.argmax(1));
  }
  greedy_continue(c, t, ids, P, c.data.mask_token_id);
  EXPECT_TRUE(at::equal(ids, naive)) << ids << naive;
  EXPECT_FALSE((ids.narrow(1, P, S - P) == c.data.mask_token_id).any().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(Targets, Generate, ::testing::Values(false, true),
                         [](const auto& i) { return std::string(i.param ? "llama" : "qwen3"); });

// The target's greedy next token after `prefix` (uncached, whole prefix).
int64_t uncached_greedy(const Config& c, const TargetWeights& t, const std::vector<int64_t>& prefix,
                        int64_t banned) {
  const at::Tensor ids = at::tensor(prefix, at::kLong).view({1, -1});
  const at::Tensor h = reference::target_forward(c, t, ids).final_hidden;
  at::Tensor logits = reference::target_logits(t, h.select(1, h.size(1) - 1));
  logits.select(1, banned).fill_(-INFINITY);
  return logits.argmax(1).item<int64_t>();
}

// A conversation answered by the target (self_distill of prepared
// conversations): the prompt turns kept in order, each answer the target's
// uncached greedy choice after everything before it, ended by the turn's
// end-of-turn token, after which the next user turn follows.
TEST(Generate, ConversationAnswersAreTheTargetsGreedyOnes) {
  Config c = fixtures::micro_config();
  c.run.dtype = DType::kFloat64;
  const TargetWeights t = make_target(c);
  const int64_t S = c.data.seq_len, banned = c.data.mask_token_id;
  // user turn 1 [0, 3), answer 1 [3, 5), user turn 2 [5, 7), answer 2 [7, 9).
  const std::vector<int64_t> user1 = {5, 9, 2}, user2 = {7, 1};
  // The end-of-turn token: the first token the target says after user turn
  // 1 that it has not said before in that answer (so the answer is longer
  // than one token and stops there).
  std::vector<int64_t> p = user1;
  p.push_back(uncached_greedy(c, t, p, banned));
  for (;;) {
    p.push_back(uncached_greedy(c, t, p, banned));
    if (std::find(p.begin() + 3, p.end() - 1, p.back()) == p.end() - 1) break;
    ASSERT_LT(p.size(), 16u) << "the target repeats itself: pick another prompt";
  }
  const int64_t eot = p.back();
  at::Tensor ids2 = at::zeros({1, S}, at::kLong), mask2 = at::zeros({1, S}, at::kBool);
  at::Tensor ids = ids2[0], mask = mask2[0];
  const std::vector<int64_t> row = {5, 9, 2, 11, eot, 7, 1, 12, eot};
  for (size_t k = 0; k < row.size(); ++k) ids[int64_t(k)] = row[k];
  for (int64_t k : {3, 4, 7, 8}) mask[k] = true;
  greedy_answers(c, t, ids2, mask2, banned);
  std::vector<int64_t> want = p, want_mask(p.size(), 1);  // answer 1: p after user turn 1
  std::fill(want_mask.begin(), want_mask.begin() + 3, 0);
  want.insert(want.end(), user2.begin(), user2.end());
  want_mask.insert(want_mask.end(), {0, 0});
  while (int64_t(want.size()) < S) {  // answer 2 until the end token or the row's end
    want.push_back(uncached_greedy(c, t, want, banned));
    want_mask.push_back(1);
    if (want.back() == eot) break;
  }
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(ids[int64_t(k)].item<int64_t>(), want[k]) << "position " << k;
    EXPECT_EQ(mask[int64_t(k)].item<bool>(), bool(want_mask[k])) << "position " << k;
  }
  for (int64_t k = int64_t(want.size()); k < S; ++k) EXPECT_FALSE(mask[k].item<bool>());
}

// Conversations decoded side by side (rows of different prompt and answer
// lengths, padded where they differ) are the conversations decoded one by
// one, token for token (float64: no near-ties).
TEST(Generate, ConversationsSideBySideEqualOneByOne) {
  Config c = fixtures::micro_config();
  c.run.dtype = DType::kFloat64;
  c.data.seq_len = 24;
  const TargetWeights t = make_target(c);
  const int64_t S = c.data.seq_len, banned = c.data.mask_token_id;
  const int64_t N = 4;
  at::Tensor ids = at::zeros({N, S}, at::kLong), mask = at::zeros({N, S}, at::kBool);
  // Rows: prompt lengths 1, 5, 3, 8; answers 2 or 3 tokens closed by token
  // 4 (the end of turn); rows 1 and 3 have a second user turn and answer.
  const std::vector<std::vector<std::pair<int64_t, bool>>> rows = {
      {{3, 0}, {6, 1}, {4, 1}},
      {{1, 0},
       {2, 0},
       {3, 0},
       {5, 0},
       {8, 0},
       {9, 1},
       {4, 1},
       {7, 0},
       {2, 0},
       {6, 1},
       {6, 1},
       {4, 1}},
      {{12, 0}, {13, 0}, {14, 0}, {15, 1}, {16, 1}, {4, 1}},
      {{2, 0},
       {2, 0},
       {3, 0},
       {3, 0},
       {5, 0},
       {5, 0},
       {7, 0},
       {7, 0},
       {1, 1},
       {4, 1},
       {9, 0},
       {10, 1},
       {4, 1}}};
  for (int64_t r = 0; r < N; ++r)
    for (size_t k = 0; k < rows[size_t(r)].size(); ++k)
      ids[r][int64_t(k)] = rows[size_t(r)][k].first,
      mask[r][int64_t(k)] = rows[size_t(r)][k].second;
  at::Tensor one_ids = ids.clone(), one_mask = mask.clone();
  for (int64_t r = 0; r < N; ++r) {
    at::Tensor i = one_ids.narrow(0, r, 1).clone(), m = one_mask.narrow(0, r, 1).clone();
    greedy_answers(c, t, i, m, banned);
    one_ids.narrow(0, r, 1).copy_(i), one_mask.narrow(0, r, 1).copy_(m);
  }
  greedy_answers(c, t, ids, mask, banned);
  EXPECT_TRUE(at::equal(ids, one_ids)) << ids << one_ids;
  EXPECT_TRUE(at::equal(mask, one_mask)) << mask << one_mask;
  EXPECT_FALSE(at::equal(ids.narrow(1, 0, 3), at::zeros({N, 3}, at::kLong)));
}

}  // namespace
}  // namespace dflash::models
