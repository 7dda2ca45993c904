// Value and cross-field rules for Config, and its resolved JSON/TOML forms.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/config.h"

namespace dflash {
namespace {

class Checker {
 public:
  explicit Checker(const Config& c) : label_(c.path.empty() ? "<config>" : c.path) {}

  [[noreturn]] void fail(const std::string& key, const std::string& expected,
                         const std::string& found) const {
    throw ConfigError(fmt::format("{}: {}: expected {}, found {}", label_, key, expected, found));
  }
  void at_least(const std::string& key, int64_t v, int64_t lo) const {
    if (v < lo) fail(key, fmt::format("an integer >= {}", lo), std::to_string(v));
  }
  void positive(const std::string& key, double v) const {
    if (!(v > 0)) fail(key, "a number > 0", fmt::format("{}", v));
  }
  void non_negative(const std::string& key, double v) const {
    if (!(v >= 0)) fail(key, "a number >= 0", fmt::format("{}", v));
  }
  void one_of(const std::string& key, const std::string& v,
              std::initializer_list<const char*> allowed) const {
    for (const char* a : allowed)
      if (v == a) return;
    fail(key, fmt::format("one of \"{}\"", fmt::join(allowed, "\", \"")), "\"" + v + "\"");
  }

  void shape(const std::string& sec, const LayerShape& s) const {
    at_least(sec + ".hidden_size", s.hidden_size, 1);
    at_least(sec + ".num_attention_heads", s.num_attention_heads, 1);
    at_least(sec + ".num_key_value_heads", s.num_key_value_heads, 1);
    if (s.num_attention_heads % s.num_key_value_heads != 0)
      fail(sec + ".num_attention_heads",
           fmt::format("a multiple of {}.num_key_value_heads ({})", sec, s.num_key_value_heads),
           std::to_string(s.num_attention_heads));
    at_least(sec + ".head_dim", s.head_dim, 2);
    if (s.head_dim % 2 != 0)
      fail(sec + ".head_dim", "an even number (RoPE rotates halves)", std::to_string(s.head_dim));
    at_least(sec + ".intermediate_size", s.intermediate_size, 1);
    positive(sec + ".rope_theta", s.rope_theta);
    positive(sec + ".rms_norm_eps", s.rms_norm_eps);
  }

  void ranks(const std::string& key, const std::vector<int64_t>& r, int64_t world) const {
    std::set<int64_t> seen;
    for (int64_t x : r) {
      if (x < 0 || x >= world)
        fail(key, fmt::format("ranks in [0, {}) (topology.world_size = {})", world, world),
             fmt::format("rank {}", x));
      if (!seen.insert(x).second) fail(key, "each rank once", fmt::format("rank {} twice", x));
    }
  }

 private:
  std::string label_;
};

void check_model(const Checker& ck, const Config& c) {
  const auto& t = c.target;
  ck.one_of("target.source", t.source, {"fixture", "hf"});
  ck.at_least("target.vocab_size", t.vocab_size, 2);
  ck.at_least("target.num_hidden_layers", t.num_hidden_layers, 1);
  ck.shape("target", t.shape);
  ck.non_negative("target.init_std", t.init_std);
  ck.non_negative("target.norm_init_jitter", t.norm_init_jitter);

  const auto& d = c.drafter;
  ck.at_least("drafter.num_hidden_layers", d.num_hidden_layers, 1);
  ck.shape("drafter", d.shape);
  if (d.shape.hidden_size != t.shape.hidden_size)
    ck.fail("drafter.hidden_size",
            fmt::format("target.hidden_size ({}): the drafter shares the target's embedding "
                        "and LM head",
                        t.shape.hidden_size),
            std::to_string(d.shape.hidden_size));
  if (d.target_layer_ids.empty())
    ck.fail("drafter.target_layer_ids", "at least one tapped layer", "an empty list");
  for (int64_t id : d.target_layer_ids)
    if (id < 0 || id >= t.num_hidden_layers)
      ck.fail("drafter.target_layer_ids",
              fmt::format("layer ids in [0, {}) (target.num_hidden_layers = {}; the default "
                          "rule spreads them over [1, Nt-3], so small targets need explicit ids)",
                          t.num_hidden_layers, t.num_hidden_layers),
              fmt::format("[{}]", fmt::join(d.target_layer_ids, ", ")));
  ck.non_negative("drafter.init_std", d.init_std);
  ck.non_negative("drafter.norm_init_jitter", d.norm_init_jitter);
}

// data.input_ids / data.loss_mask: present exactly when source = "inline",
// (batch_size, seq_len), ids in the vocabulary, mask entries 0 or 1.
void check_inline_rows(const Checker& ck, const Config& c) {
  const auto& d = c.data;
  const bool is_inline = d.source == "inline";
  for (const auto* m : {&d.input_ids, &d.loss_mask}) {
    const char* key = m == &d.input_ids ? "data.input_ids" : "data.loss_mask";
    if (!is_inline) {
      if (!m->empty()) ck.fail(key, "no rows unless data.source = \"inline\"", "rows");
      continue;
    }
    if (int64_t(m->size()) != d.batch_size)
      ck.fail(key, fmt::format("data.batch_size = {} rows", d.batch_size),
              fmt::format("{} rows", m->size()));
    for (size_t r = 0; r < m->size(); ++r) {
      if (int64_t((*m)[r].size()) != d.seq_len)
        ck.fail(key, fmt::format("rows of data.seq_len = {} entries", d.seq_len),
                fmt::format("row {} with {}", r, (*m)[r].size()));
      const int64_t hi = m == &d.input_ids ? c.target.vocab_size - 1 : 1;
      for (int64_t v : (*m)[r])
        if (v < 0 || v > hi)
          ck.fail(key, fmt::format("entries in [0, {}]", hi), fmt::format("{} in row {}", v, r));
    }
  }
}

void check_data_loss_run(const Checker& ck, const Config& c) {
  const auto& d = c.data;
  ck.one_of("data.source", d.source,
            {"fixture", "inline", "jsonl", "shards", "features", "self_distill"});
  const bool needs_path = d.source == "jsonl" || d.source == "shards" || d.source == "features";
  if (needs_path && d.path.empty())
    ck.fail("data.path", "a file or directory for data.source = \"" + d.source + "\"", "nothing");
  if (!needs_path && !d.path.empty())
    ck.fail("data.path", "no path unless data.source is jsonl, shards or features",
            "\"" + d.path + "\"");
  ck.at_least("data.eval_samples", d.eval_samples, 0);
  ck.at_least("data.num_samples", d.num_samples, 1);
  if (d.source == "self_distill" && (d.prompt_len < 1 || d.prompt_len > d.seq_len - 2))
    ck.fail("data.prompt_len", fmt::format("in [1, data.seq_len - 2 = {}]", d.seq_len - 2),
            std::to_string(d.prompt_len));
  ck.at_least("data.batch_size", d.batch_size, 1);
  ck.at_least("data.seq_len", d.seq_len, 2);
  ck.at_least("data.block_size", d.block_size, 2);
  ck.at_least("data.max_anchors", d.max_anchors, 1);
  if (d.mask_token_id < 0 || d.mask_token_id >= c.target.vocab_size)
    ck.fail("data.mask_token_id",
            fmt::format("a token id in [0, target.vocab_size = {})", c.target.vocab_size),
            std::to_string(d.mask_token_id));

  check_inline_rows(ck, c);

  const auto& l = c.loss;
  ck.non_negative("loss.ce_weight", l.ce_weight);
  ck.non_negative("loss.kl_weight", l.kl_weight);
  if (l.ce_weight == 0 && l.kl_weight == 0)
    ck.fail("loss.ce_weight", "ce_weight or kl_weight > 0 (the loss would be identically 0)",
            "both 0");
  ck.positive("loss.temperature", l.temperature);
  ck.non_negative("loss.gamma", l.gamma);
  ck.at_least("loss.chunk_size", l.chunk_size, 0);

  ck.at_least("run.threads", c.run.threads, 0);
  ck.at_least("optimized.attention_tile", c.optimized.attention_tile, 1);
  ck.at_least("optimized.target_query_chunk", c.optimized.target_query_chunk, 0);
}

void check_train(const Checker& ck, const TrainConfig& t) {
  ck.at_least("train.steps", t.steps, 1);
  ck.at_least("train.micro_batches", t.micro_batches, 1);
  ck.positive("train.lr", t.lr);
  ck.at_least("train.warmup_steps", t.warmup_steps, 0);
  if (t.min_lr_ratio < 0 || t.min_lr_ratio > 1)
    ck.fail("train.min_lr_ratio", "a number in [0, 1]", fmt::format("{}", t.min_lr_ratio));
  ck.non_negative("train.weight_decay", t.weight_decay);
  ck.non_negative("train.clip_norm", t.clip_norm);
  for (auto [key, b] : {std::pair<const char*, double>{"train.beta1", t.beta1},
                        std::pair<const char*, double>{"train.beta2", t.beta2}})
    if (b < 0 || b >= 1) ck.fail(key, "a number in [0, 1)", fmt::format("{}", b));
  ck.at_least("train.eval_every", t.eval_every, 0);
  ck.at_least("train.eval_batches", t.eval_batches, 1);
  ck.at_least("train.checkpoint_every", t.checkpoint_every, 0);
  ck.at_least("train.keep_checkpoints", t.keep_checkpoints, 1);
  ck.at_least("train.log_every", t.log_every, 1);
}

void check_topology(const Checker& ck, const Config& c) {
  const auto& tp = c.topology;
  ck.at_least("topology.world_size", tp.world_size, 1);
  ck.one_of("topology.device", tp.device, {"cpu", "cuda"});
  ck.ranks("topology.target_ranks", tp.target_ranks, tp.world_size);
  ck.ranks("topology.drafter_ranks", tp.drafter_ranks, tp.world_size);
  if (tp.drafter_ranks.empty())
    ck.fail("topology.drafter_ranks", "at least one drafter rank", "an empty list");
  if (tp.target_ranks.empty())
    ck.fail("topology.target_ranks", "at least one target rank", "an empty list");
  if (tp.world_size > 1) {
    std::set<int64_t> all(tp.target_ranks.begin(), tp.target_ranks.end());
    for (int64_t r : tp.drafter_ranks)
      if (!all.insert(r).second)
        ck.fail("topology.drafter_ranks", "ranks disjoint from topology.target_ranks",
                fmt::format("rank {} in both", r));
    if (int64_t(all.size()) != tp.world_size)
      ck.fail("topology.world_size", "every rank to be a target or a drafter rank",
              fmt::format("world_size {} but {} ranks assigned", tp.world_size, all.size()));
  }
  ck.non_negative("topology.memory_reserve_gb", tp.memory_reserve_gb);
  ck.positive("topology.timeout_s", tp.timeout_s);
  ck.positive("topology.startup_timeout_s", tp.startup_timeout_s);
  ck.at_least("topology.queue_depth", tp.queue_depth, 1);
  if (!tp.device_memory_gb.empty()) {
    if (int64_t(tp.device_memory_gb.size()) != tp.world_size)
      ck.fail("topology.device_memory_gb",
              fmt::format("one number, or one per rank ({})", tp.world_size),
              fmt::format("{} numbers", tp.device_memory_gb.size()));
    for (double g : tp.device_memory_gb) ck.positive("topology.device_memory_gb", g);
  }
}

}  // namespace

void validate_config(const Config& c) {
  Checker ck(c);
  check_model(ck, c);
  check_data_loss_run(ck, c);
  check_topology(ck, c);
  check_train(ck, c.train);
}

namespace {
nlohmann::json shape_json(const LayerShape& s) {
  return {{"hidden_size", s.hidden_size},
          {"num_attention_heads", s.num_attention_heads},
          {"num_key_value_heads", s.num_key_value_heads},
          {"head_dim", s.head_dim},
          {"intermediate_size", s.intermediate_size},
          {"rope_theta", s.rope_theta},
          {"rms_norm_eps", s.rms_norm_eps}};
}
}  // namespace

nlohmann::json config_to_json(const Config& c) {
  nlohmann::json t = shape_json(c.target.shape);
  t["source"] = c.target.source;
  if (!c.target.path.empty()) t["path"] = c.target.path;
  t["vocab_size"] = c.target.vocab_size;
  t["num_hidden_layers"] = c.target.num_hidden_layers;
  t["tie_word_embeddings"] = c.target.tie_word_embeddings;
  t["init_std"] = c.target.init_std;
  t["norm_init_jitter"] = c.target.norm_init_jitter;
  nlohmann::json d = shape_json(c.drafter.shape);
  d["num_hidden_layers"] = c.drafter.num_hidden_layers;
  d["target_layer_ids"] = c.drafter.target_layer_ids;
  d["init_std"] = c.drafter.init_std;
  d["norm_init_jitter"] = c.drafter.norm_init_jitter;
  nlohmann::json j;
  j["target"] = t;
  j["drafter"] = d;
  j["data"] = {{"source", c.data.source},           {"batch_size", c.data.batch_size},
               {"seq_len", c.data.seq_len},         {"block_size", c.data.block_size},
               {"max_anchors", c.data.max_anchors}, {"mask_token_id", c.data.mask_token_id}};
  if (!c.data.path.empty()) j["data"]["path"] = c.data.path;
  if (!c.data.eval_path.empty()) j["data"]["eval_path"] = c.data.eval_path;
  j["data"]["eval_samples"] = c.data.eval_samples;
  j["data"]["num_samples"] = c.data.num_samples;
  j["data"]["prompt_len"] = c.data.prompt_len;
  if (c.data.source == "inline") {
    j["data"]["input_ids"] = c.data.input_ids;
    j["data"]["loss_mask"] = c.data.loss_mask;
  }
  j["loss"] = {{"ce_weight", c.loss.ce_weight},
               {"kl_weight", c.loss.kl_weight},
               {"temperature", c.loss.temperature},
               {"gamma", c.loss.gamma},
               {"chunk_size", c.loss.chunk_size}};
  j["run"] = {{"seed", c.run.seed}, {"dtype", dtype_name(c.run.dtype)}, {"threads", c.run.threads}};
  j["optimized"] = {{"chunked_loss", c.optimized.chunked_loss},
                    {"sparse_attention", c.optimized.sparse_attention},
                    {"checkpoint_layers", c.optimized.checkpoint_layers},
                    {"attention_tile", c.optimized.attention_tile},
                    {"target_query_chunk", c.optimized.target_query_chunk}};
  j["topology"] = {{"world_size", c.topology.world_size},
                   {"target_ranks", c.topology.target_ranks},
                   {"drafter_ranks", c.topology.drafter_ranks},
                   {"device", c.topology.device}};
  if (!c.topology.device_memory_gb.empty())
    j["topology"]["device_memory_gb"] = c.topology.device_memory_gb;
  j["topology"]["memory_reserve_gb"] = c.topology.memory_reserve_gb;
  j["topology"]["timeout_s"] = c.topology.timeout_s;
  j["topology"]["startup_timeout_s"] = c.topology.startup_timeout_s;
  j["topology"]["queue_depth"] = c.topology.queue_depth;
  const TrainConfig& tr = c.train;
  j["train"] = {{"steps", tr.steps},
                {"micro_batches", tr.micro_batches},
                {"lr", tr.lr},
                {"warmup_steps", tr.warmup_steps},
                {"min_lr_ratio", tr.min_lr_ratio},
                {"weight_decay", tr.weight_decay},
                {"clip_norm", tr.clip_norm},
                {"beta1", tr.beta1},
                {"beta2", tr.beta2},
                {"eval_every", tr.eval_every},
                {"eval_batches", tr.eval_batches},
                {"checkpoint_every", tr.checkpoint_every},
                {"keep_checkpoints", tr.keep_checkpoints},
                {"log_every", tr.log_every},
                {"out_dir", tr.out_dir}};
  return j;
}

std::string config_to_toml(const Config& c) {
  // Same tree as the JSON form, printed section by section.
  nlohmann::json j = config_to_json(c);
  std::ostringstream os;
  for (const char* sec :
       {"target", "drafter", "data", "loss", "run", "optimized", "topology", "train"}) {
    os << "[" << sec << "]\n";
    for (auto it = j[sec].begin(); it != j[sec].end(); ++it) {
      const auto& v = it.value();
      os << it.key() << " = ";
      if (v.is_number_float()) {
        // Shortest round-trip form; TOML needs a '.' or exponent in a float.
        std::string num = fmt::format("{}", v.get<double>());
        if (num.find_first_of(".en") == std::string::npos) num += ".0";
        os << num;
      } else {
        os << v.dump();
      }
      os << "\n";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace dflash
