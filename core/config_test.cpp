// Config validation: one case per rejected-value class, each checking that
// the message names the file and the key (DEVELOPERS.md: bad input gets a
// clear error naming the file and field).
#include "core/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fixtures/test_support.h"

namespace dflash {
namespace {

const char* kBase = R"(
[target]
vocab_size = 64
hidden_size = 32
num_hidden_layers = 6
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8
intermediate_size = 48

[drafter]
num_hidden_layers = 2

[data]
batch_size = 2
seq_len = 16
block_size = 4
max_anchors = 3
mask_token_id = 63

[loss]
kl_weight = 0.5

[run]
seed = 7
)";

// Replaces the first line starting with `key =` (within the text) by `line`,
// or appends `line` under `[section]` when `key` is empty.
std::string with(const std::string& key, const std::string& line, const std::string& section = "") {
  std::string s = kBase;
  if (!key.empty()) {
    size_t p = s.find("\n" + key + " =");
    if (p == std::string::npos) throw std::logic_error("no key " + key);
    size_t e = s.find('\n', p + 1);
    return s.substr(0, p + 1) + line + s.substr(e);
  }
  size_t p = s.find("[" + section + "]\n");
  if (p == std::string::npos) return s + "\n[" + section + "]\n" + line + "\n";
  p += section.size() + 3;
  return s.substr(0, p) + line + "\n" + s.substr(p);
}

// kBase with each (old, new) substring replaced once.
std::string replaced(std::string s, std::vector<std::pair<std::string, std::string>> edits) {
  for (const auto& [from, to] : edits) {
    const size_t p = s.find(from);
    if (p == std::string::npos) throw std::logic_error("no " + from);
    s.replace(p, from.size(), to);
  }
  return s;
}

std::string error_of(const std::string& text) {
  try {
    parse_config_toml(text, "case.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

struct Rejected {
  const char* name;
  std::string text;
  const char* key;       // must appear in the message
  const char* expected;  // and so must this fragment of the expectation
};

class ConfigRejects : public ::testing::TestWithParam<Rejected> {};

TEST_P(ConfigRejects, MessageNamesFileAndKey) {
  const Rejected& r = GetParam();
  const std::string msg = error_of(r.text);
  ASSERT_FALSE(msg.empty()) << r.name << ": config was accepted";
  EXPECT_NE(msg.find("case.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find(r.key), std::string::npos) << msg;
  EXPECT_NE(msg.find(r.expected), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Classes, ConfigRejects,
    ::testing::Values(
        Rejected{"heads_not_dividing", with("num_attention_heads", "num_attention_heads = 3"),
                 "target.num_attention_heads", "multiple of target.num_key_value_heads"},
        Rejected{"head_dim_odd", with("head_dim", "head_dim = 7"), "target.head_dim", "even"},
        Rejected{"block_size_below_2", with("block_size", "block_size = 1"), "data.block_size",
                 "an integer in [2, 4096]"},
        Rejected{"mask_id_outside_vocab", with("mask_token_id", "mask_token_id = 64"),
                 "data.mask_token_id", "[0, target.vocab_size = 64)"},
        Rejected{"unknown_key", with("", "hiden_size = 3", "drafter"), "drafter.hiden_size",
                 "known keys"},
        Rejected{"unknown_section", kBase + std::string("\n[optimiser]\nlr = 1\n"), "optimiser",
                 "sections"},
        Rejected{"wrong_type", with("batch_size", "batch_size = \"two\""), "data.batch_size",
                 "an integer"},
        Rejected{"missing_required", with("vocab_size", "# none"), "target.vocab_size", "required"},
        Rejected{"non_positive_size", with("seq_len", "seq_len = 1"), "data.seq_len",
                 "[2, 4194304]"},
        Rejected{"zero_heads", with("num_key_value_heads", "num_key_value_heads = 0"),
                 "target.num_key_value_heads", "[1, 1024]"},
        Rejected{"unknown_dtype", with("seed", "seed = 7\ndtype = \"float16\""), "run.dtype",
                 "float32"},
        Rejected{"negative_seed", with("seed", "seed = -1"), "run.seed", ">= 0"},
        Rejected{"layer_id_out_of_range", with("", "target_layer_ids = [1, 6]", "drafter"),
                 "drafter.target_layer_ids", "[0, 6)"},
        Rejected{"empty_layer_ids", with("", "target_layer_ids = []", "drafter"),
                 "drafter.target_layer_ids", "at least one"},
        Rejected{"layer_ids_unsorted", with("", "target_layer_ids = [3, 1]", "drafter"),
                 "drafter.target_layer_ids", "distinct ids in ascending order"},
        Rejected{"layer_ids_repeated", with("", "target_layer_ids = [1, 1]", "drafter"),
                 "drafter.target_layer_ids", "distinct ids in ascending order"},
        Rejected{"last_layer_tapped", with("", "target_layer_ids = [1, 5]", "drafter"),
                 "drafter.target_layer_ids", "allow_last_layer_tap = true"},
        Rejected{"drafter_hidden_mismatch", with("", "hidden_size = 16", "drafter"),
                 "drafter.hidden_size", "target.hidden_size (32)"},
        Rejected{"temperature_not_positive", with("kl_weight", "kl_weight = 0.5\ntemperature = 0"),
                 "loss.temperature", "(0, 10000]"},
        Rejected{"negative_gamma", with("kl_weight", "kl_weight = 0.5\ngamma = -1.0"), "loss.gamma",
                 "[0, 1000000]"},
        Rejected{"negative_weight", with("kl_weight", "kl_weight = -0.5"), "loss.kl_weight",
                 "[0, 1000000]"},
        Rejected{"all_weights_zero", with("kl_weight", "kl_weight = 0\nce_weight = 0"),
                 "loss.ce_weight", "all 0"},
        Rejected{"jsd_beta_above_1", with("kl_weight", "jsd_weight = 1\njsd_beta = 1.5"),
                 "loss.jsd_beta", "[0, 1]"},
        Rejected{"negative_tv_weight", with("kl_weight", "tv_weight = -1"), "loss.tv_weight",
                 "[0, 1000000]"},
        Rejected{"unknown_weighting", with("kl_weight", "weighting = \"d-pace\""), "loss.weighting",
                 "\"decay\", \"dpace\" or \"uniform\""},
        Rejected{"gamma_without_decay", with("kl_weight", "weighting = \"dpace\"\ngamma = 4.0"),
                 "loss.gamma", "0 with weighting = \"dpace\""},
        Rejected{"dpace_alpha_without_dpace", with("kl_weight", "dpace_alpha = 0.3"),
                 "loss.dpace_alpha", "weighting = \"dpace\""},
        Rejected{"dpace_alpha_zero", with("kl_weight", "weighting = \"dpace\"\ndpace_alpha = 0"),
                 "loss.dpace_alpha", "(0, 1]"},
        Rejected{"negative_chunk", with("kl_weight", "kl_weight = 0.5\nchunk_size = -2"),
                 "loss.chunk_size", "[0, 4194304]"},
        Rejected{"not_finite", with("kl_weight", "kl_weight = nan"), "loss.kl_weight", "finite"},
        Rejected{"device_named_gpu", with("", "device = \"gpu\"", "topology"), "topology.device",
                 "\"cuda:N\""},
        Rejected{"device_index_with_leading_zero", with("", "device = \"cuda:01\"", "topology"),
                 "topology.device", "\"cuda:N\""},
        Rejected{"device_index_too_large", with("", "device = \"cuda:1024\"", "topology"),
                 "topology.device", "N a device index < 1024"},
        Rejected{"unknown_kernels", with("", "kernels = \"cuda\"", "optimized"),
                 "optimized.kernels", "\"aten\""},
        Rejected{"host_kernels_on_cuda",
                 with("", "device = \"cuda\"", "topology") + "\n[optimized]\nkernels = \"host\"\n",
                 "optimized.kernels", "CPU tensors only"},
        Rejected{"rank_out_of_range",
                 with("", "world_size = 2\ntarget_ranks = [0]\ndrafter_ranks = [2]", "topology"),
                 "topology.drafter_ranks", "[0, 2)"},
        Rejected{"no_drafter_rank",
                 with("", "world_size = 2\ntarget_ranks = [0, 1]\ndrafter_ranks = []", "topology"),
                 "topology.drafter_ranks", "at least one drafter"},
        Rejected{"rank_in_both_roles",
                 with("", "world_size = 2\ntarget_ranks = [0, 1]\ndrafter_ranks = [1]", "topology"),
                 "topology.drafter_ranks", "disjoint"},
        Rejected{"rank_unassigned",
                 with("", "world_size = 3\ntarget_ranks = [0]\ndrafter_ranks = [1]", "topology"),
                 "topology.world_size", "every rank"},
        Rejected{"memory_list_length",
                 with("",
                      "world_size = 2\ntarget_ranks = [0]\ndrafter_ranks = [1]\ndevice_memory_gb = "
                      "[80.0, 80.0, 80.0]",
                      "topology"),
                 "topology.device_memory_gb", "one per rank"},
        Rejected{"unknown_device", with("", "device = \"tpu\"", "topology"), "topology.device",
                 "\"cpu\""},
        Rejected{"tile_not_positive", with("", "attention_tile = 0", "optimized"),
                 "optimized.attention_tile", "[1, 1048576]"},
        Rejected{"switch_not_bool", with("", "chunked_loss = 1", "optimized"),
                 "optimized.chunked_loss", "true or false"},
        Rejected{"inline_rows_without_inline_source", with("", "input_ids = [[1, 2]]", "data"),
                 "data.input_ids", "source = \"inline\""},
        Rejected{"inline_row_too_short",
                 with("mask_token_id",
                      "mask_token_id = 63\nsource = \"inline\"\ninput_ids = [[1], [2]]\nloss_mask "
                      "= [[1], [0]]"),
                 "data.input_ids", "data.seq_len = 16"},
        Rejected{"jsonl_without_path", with("", "source = \"jsonl\"", "data"), "data.path",
                 "for data.source = \"jsonl\""},
        Rejected{"unknown_data_source", with("", "source = \"parquet\"", "data"), "data.source",
                 "self_distill"},
        Rejected{"prompt_too_long", with("", "source = \"self_distill\"\nprompt_len = 15", "data"),
                 "data.prompt_len", "[1, data.seq_len - 2 = 14]"},
        Rejected{"lr_not_positive", with("", "lr = 0.0", "train"), "train.lr", "(0, 10]"},
        Rejected{"beta_of_one", with("", "beta2 = 1.0", "train"), "train.beta2", "[0, 1)"},
        Rejected{"min_lr_ratio_above_one", with("", "min_lr_ratio = 1.5", "train"),
                 "train.min_lr_ratio", "[0, 1]"},
        Rejected{"unknown_train_key", with("", "learning_rate = 1e-3", "train"),
                 "train.learning_rate", "known keys"},
        Rejected{"hf_without_path", with("", "source = \"hf\"", "target"), "target.path",
                 "required"},
        Rejected{"hf_directory_missing",
                 with("", "source = \"hf\"\npath = \"/nonexistent/model\"", "target"),
                 "/nonexistent/model/config.json", "cannot open"},
        // Issue 14: numbers with extra digits are refused by their range before
        // anything is sized by them (the default tap ids once took Nd ids).
        Rejected{"layers_with_extra_digits",
                 replaced(kBase, {{"[drafter]\nnum_hidden_layers = 2",
                                   "[drafter]\nnum_hidden_layers = 4294967297"}}),
                 "drafter.num_hidden_layers", "[1, 256]"},
        Rejected{"heads_of_a_million", with("num_attention_heads", "num_attention_heads = 1000000"),
                 "target.num_attention_heads", "[1, 1024]"},
        Rejected{"vocab_too_large", with("vocab_size", "vocab_size = 16777217"),
                 "target.vocab_size", "[2, 16777216]"},
        Rejected{"world_size_huge_with_one_memory_figure",
                 with("", "world_size = 4294967297\ndevice_memory_gb = 80.0", "topology"),
                 "topology.world_size", "[1, 65536]"},
        Rejected{"eps_not_below_one", with("", "rms_norm_eps = 2.0", "drafter"),
                 "drafter.rms_norm_eps", "(0, 1]"},
        Rejected{"parameters_beyond_2_to_40",
                 replaced(kBase, {{"vocab_size = 64", "vocab_size = 16777216"},
                                  {"hidden_size = 32", "hidden_size = 65536"}}),
                 "parameters", "at most 2^40"},
        Rejected{"tensor_beyond_2_to_60_elements",
                 replaced(kBase, {{"vocab_size = 64", "vocab_size = 16777216"},
                                  {"batch_size = 2", "batch_size = 65536"},
                                  {"seq_len = 16", "seq_len = 4194304"}}),
                 "data.batch_size", "target logits B*S*V"},
        Rejected{"not_toml", "[target\nvocab_size = 3", "line 1", "not valid TOML"}),
    [](const ::testing::TestParamInfo<Rejected>& i) { return std::string(i.param.name); });

TEST(Config, BaseIsValidAndResolvesDefaults) {
  const Config c = parse_config_toml(kBase, "base.toml");
  EXPECT_EQ(c.drafter.shape.hidden_size, 32);
  EXPECT_EQ(c.drafter.shape.num_attention_heads, 4);  // inherited from the target
  EXPECT_EQ(c.drafter.target_layer_ids, (std::vector<int64_t>{1, 3}));
  // The last layer, opted in: a drafter for dflash's own decoding only.
  EXPECT_EQ(parse_config_toml(replaced(kBase, {{"[drafter]\n",
                                                "[drafter]\ntarget_layer_ids = [1, 5]\n"
                                                "allow_last_layer_tap = true\n"}}),
                              "opt-in.toml")
                .drafter.target_layer_ids,
            (std::vector<int64_t>{1, 5}));
  EXPECT_DOUBLE_EQ(c.loss.ce_weight, 1.0);
  EXPECT_EQ(c.run.dtype, DType::kFloat32);
}

TEST(Config, DeviceNames) {
  for (const char* ok : {"cpu", "cuda", "cuda:0", "cuda:7", "cuda:1023"})
    EXPECT_TRUE(is_device_name(ok)) << ok;
  for (const char* bad :
       {"", "gpu", "cuda:", "cuda:01", "cuda:1024", "cuda:-1", "cuda:x", "CPU", "cuda:0 "})
    EXPECT_FALSE(is_device_name(bad)) << bad;
  // The accepted ones load: a CUDA config is read (and checked) on a CPU machine.
  EXPECT_EQ(error_of(with("", "device = \"cuda:3\"", "topology")), "");
  EXPECT_EQ(error_of(with("", "kernels = \"aten\"", "optimized")), "");
}

TEST(Config, DefaultLayerIdsFollowSpecRule) {
  // SPEC: spread evenly over [1, Nt-3], rounded half to even (Python round).
  EXPECT_EQ(default_target_layer_ids(64, 5), (std::vector<int64_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(default_target_layer_ids(36, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(default_target_layer_ids(28, 1), (std::vector<int64_t>{14}));
  // Nt = 7: 1 + 3/2 = 2.5 rounds to 2; Nt = 9: 1 + 5/2 = 3.5 rounds to 4.
  EXPECT_EQ(default_target_layer_ids(7, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(default_target_layer_ids(9, 3), (std::vector<int64_t>{1, 4, 6}));
}

TEST(Config, JsonAndTomlRoundTrip) {
  const Config c = parse_config_toml(kBase, "base.toml");
  const Config j = parse_config_json(config_to_json(c), "json");
  EXPECT_EQ(config_to_json(j), config_to_json(c));
  const Config t = parse_config_toml(config_to_toml(c), "printed.toml");
  EXPECT_EQ(config_to_json(t), config_to_json(c));
}

TEST(Config, InlineRowsRoundTrip) {
  std::string text = kBase;
  text.replace(text.find("mask_token_id = 63"), 18,
               "mask_token_id = 63\nsource = \"inline\"\ninput_ids = [" +
                   std::string("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],") +
                   "[16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1]]\nloss_mask = [" +
                   "[0,0,1,1,1,1,1,1,1,1,1,1,1,1,1,1],[1,1,1,1,1,1,1,1,0,0,0,0,0,0,0,0]]");
  const Config c = parse_config_toml(text, "inline.toml");
  EXPECT_EQ(c.data.input_ids[1][0], 16);
  const Config t = parse_config_toml(config_to_toml(c), "printed.toml");
  EXPECT_EQ(t.data.input_ids, c.data.input_ids);
  EXPECT_EQ(t.data.loss_mask, c.data.loss_mask);
}

TEST(Config, MissingFileIsNamed) {
  try {
    load_config("/nonexistent/dir/x.toml");
    FAIL() << "accepted a missing file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.toml"), std::string::npos);
  }
}

// `--set KEY=VALUE` (dflash train / preflight): numbers, bare words and
// quoted strings replace keys or add them (a missing section included), in
// order; each override meets the file's checks, and a bad one is named with
// the file.
TEST(Config, SetOverridesMeetTheFilesChecks) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "dflash-set-test.toml").string();
  std::ofstream(path) << kBase;
  const Config c =
      load_config(path, {"loss.kl_weight=0", "loss.reverse_kl_weight=0.25",
                         "loss.weighting=uniform", "loss.jsd_weight=1", "loss.jsd_beta=0.3",
                         "loss.jsd_beta=0.4", "optimized.kernels=\"aten\"", "run.seed=9"});
  EXPECT_EQ(c.path, path);
  EXPECT_DOUBLE_EQ(c.loss.kl_weight, 0.0);
  EXPECT_DOUBLE_EQ(c.loss.reverse_kl_weight, 0.25);
  EXPECT_EQ(c.loss.weighting, Weighting::kUniform);
  EXPECT_DOUBLE_EQ(c.loss.jsd_beta, 0.4);  // the last one wins
  EXPECT_EQ(c.optimized.kernels, "aten");  // [optimized] was not in the file
  EXPECT_EQ(c.run.seed, 9u);
  EXPECT_EQ(config_to_json(load_config(path, {})), config_to_json(load_config(path)));
  auto error = [&](const std::string& kv) {
    try {
      load_config(path, {kv});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const auto& [kv, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"loss.nope=1", "loss.nope: expected one of the known keys"},
           {"loss.jsd_beta=2", "loss.jsd_beta: expected a number in [0, 1]"},
           {"loss.weighting=dpacey", "found \"dpacey\""},
           {"loss.kl_weight=high", "loss.kl_weight: expected"},
           {"loss.tv_weight", "expected KEY=VALUE"},
           {"loss..tv_weight=1", "expected a dotted key"},
           {"loss.kl_weight.x=1", "kl_weight is"},
           {"nosuch.key=1", "nosuch"}}) {
    const std::string msg = error(kv);
    EXPECT_NE(msg.find(path), std::string::npos) << kv << ": " << msg;
    EXPECT_NE(msg.find(kv.substr(0, kv.find('='))), std::string::npos) << kv << ": " << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << kv << ": " << msg;
  }
  std::filesystem::remove(path);
}

TEST(Config, ShippedConfigsValidate) {
  const std::string root =
      std::getenv("DFLASH_SOURCE_DIR") ? std::getenv("DFLASH_SOURCE_DIR") : ".";
  const Config tiny = load_config(root + "/fixtures/configs/tiny.toml");
  EXPECT_EQ(tiny.run.dtype, DType::kFloat32);
  const Config seed = load_config(root + "/fixtures/configs/seed-8gpu.toml");
  EXPECT_EQ(seed.topology.world_size, 8);
  EXPECT_EQ(seed.topology.target_ranks.size(), 5u);
  EXPECT_EQ(seed.topology.drafter_ranks.size(), 3u);
  EXPECT_EQ(seed.topology.device_memory_gb, std::vector<double>(8, 95.0));
  EXPECT_EQ(seed.data.max_anchors * seed.data.block_size, 32768);  // Q
  EXPECT_EQ(seed.data.seq_len + 32768, 81920);                     // key span
  EXPECT_EQ(seed.drafter.target_layer_ids, (std::vector<int64_t>{1, 16, 31, 46, 61}));
}

// docs/CONFIG.md's key table is config_fields_markdown() as printed: every
// key with its default, range and rule, stated once in
// core/config_fields.cpp (on a mismatch the message is the table to paste).
TEST(Config, DocsTableIsTheFieldTable) {
  const std::string root =
      std::getenv("DFLASH_SOURCE_DIR") ? std::getenv("DFLASH_SOURCE_DIR") : ".";
  std::ifstream in(root + "/docs/CONFIG.md");
  ASSERT_TRUE(in) << root << "/docs/CONFIG.md";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string table = config_fields_markdown();
  EXPECT_NE(doc.find("\n" + table + "\n"), std::string::npos)
      << "docs/CONFIG.md lacks the key table; paste:\n"
      << table;
}

// An optional key the file leaves out takes its member's initialiser (a
// default-constructed Config): the field table states no default of its own.
TEST(Config, OptionalKeysDefaultToTheMembersInitialisers) {
  const Config c = parse_config_toml(with("kl_weight", "kl_weight = 0.0"), "case.toml");
  const Config d;
  for (const ConfigField& f : config_fields()) {
    if (f.need != ConfigField::Need::kOptional || std::string(f.key) == "run.seed") continue;
    EXPECT_EQ(field_json(f, c), field_json(f, d)) << f.key;
  }
  EXPECT_EQ(c.run.seed, 7u);  // given by the file
}

// A range check on each side of a bound, for an integer and a half-open
// real range: the messages name file, key, range and value.
TEST(Config, RangesHoldAtTheirBounds) {
  const ConfigRange& v = config_range("target.vocab_size");
  EXPECT_TRUE(v.contains_int(2) && v.contains_int(1 << 24));
  EXPECT_FALSE(v.contains_int(1) || v.contains_int((1 << 24) + 1));
  const ConfigRange& b = config_range("train.beta2");
  EXPECT_TRUE(b.contains(0.0) && b.contains(0.999));
  EXPECT_FALSE(b.contains(1.0) || b.contains(-1e-9) || b.contains(std::nan("")));
  EXPECT_EQ(b.text(), "[0, 1)");
  const std::string msg = error_of(replaced(kBase, {{"vocab_size = 64", "vocab_size = 16777217"}}));
  EXPECT_NE(msg.find("case.toml: target.vocab_size: expected an integer in [2, 16777216] "
                     "(docs/CONFIG.md), found 16777217"),
            std::string::npos)
      << msg;
}

// config.json from another tool: every number held to the range of the key
// it fills; integers beyond int64 are refused, not wrapped to negatives.
TEST(Config, HfConfigNumbersAreHeldToTheirRanges) {
  const std::string base = R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64,
      "num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "rope_theta": 1e6})";
  EXPECT_EQ(parse_hf_config(base, "m/config.json").vocab_size, 64);
  struct Case {
    const char* from;
    const char* to;
    const char* expected;
  };
  for (const Case& k : {
           Case{"\"vocab_size\": 64", "\"vocab_size\": 18446744073709551615",
                "vocab_size: expected an integer in [2, 16777216] (docs/CONFIG.md), found "
                "18446744073709551615"},
           Case{"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 4294967297",
                "num_hidden_layers: expected an integer in [1, 1024]"},
           Case{"\"head_dim\": 8", "\"head_dim\": -8",
                "head_dim: expected an integer in [2, 1024]"},
           Case{"\"rope_theta\": 1e6", "\"rope_theta\": -1.0",
                "rope_theta: expected a number in (0"},
           Case{"\"hidden_size\": 32", "\"hidden_size\": 32.5", "hidden_size: expected an integer"},
       }) {
    std::string text = base;
    text.replace(text.find(k.from), std::string(k.from).size(), k.to);
    try {
      parse_hf_config(text, "m/config.json");
      ADD_FAILURE() << "accepted " << k.to;
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("m/config.json: ") + k.expected), std::string::npos) << msg;
    }
  }
}

// transformers 5 writes the RoPE base inside rope_parameters: it is read
// there (a silent default of 1e4 would be another model), and a top-level
// rope_theta that disagrees is refused.
TEST(Config, HfConfigRopeParametersOfTransformers5) {
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 64,
      "num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
      "intermediate_size": 48, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5,
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}})";
  const TargetConfig t = parse_hf_config(base, "m/config.json");
  EXPECT_EQ(t.architecture, "llama");
  EXPECT_EQ(t.shape.rope_theta, 5e5);
  EXPECT_EQ(t.shape.head_dim, 8);  // Llama's default: hidden / heads
  EXPECT_FALSE(t.shape.qk_norm);
  EXPECT_EQ(t.shape.rope_scaling.type, "llama3");
  EXPECT_EQ(t.shape.rope_scaling.original_max_position_embeddings, 8192);
  std::string bad = base;
  bad.insert(bad.size() - 1, R"(, "rope_theta": 1e4)");
  testing_support::expect_error([&] { parse_hf_config(bad, "m/config.json"); },
                                {"rope_parameters.rope_theta: expected rope_theta's 10000"});
  bad = base;
  bad.replace(bad.find("\"high_freq_factor\": 4.0"), 23, "\"high_freq_factor\": 0.5");
  testing_support::expect_error([&] { parse_hf_config(bad, "m/config.json"); },
                                {"high_freq_factor: expected more than low_freq_factor"});
}

}  // namespace
}  // namespace dflash
