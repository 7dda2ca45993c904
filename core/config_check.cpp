// Value and cross-field rules for Config, and its resolved TOML form. Every
// number is held to its documented range (config_fields(), listed in
// docs/CONFIG.md) before any rule between keys reads it and before anything
// sizes memory by it, and the products that size tensors are checked for
// int64 overflow.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
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
  // Held to the key's documented range (config_ranges()).
  void in_range(const std::string& key, int64_t v) const {
    const ConfigRange& r = config_range(key);
    if (!r.contains_int(v))
      fail(key, fmt::format("an integer in {} (docs/CONFIG.md)", r.text()), std::to_string(v));
  }
  void in_range(const std::string& key, double v) const {
    const ConfigRange& r = config_range(key);
    if (!r.contains(v))
      fail(key, fmt::format("a number in {} (docs/CONFIG.md)", r.text()), fmt::format("{}", v));
  }
  void one_of(const std::string& key, const std::string& v,
              std::initializer_list<const char*> allowed) const {
    for (const char* a : allowed)
      if (v == a) return;
    fail(key, fmt::format("one of \"{}\"", fmt::join(allowed, "\", \"")), "\"" + v + "\"");
  }

  void shape(const std::string& sec, const LayerShape& s) const {
    if (s.num_attention_heads % s.num_key_value_heads != 0)
      fail(sec + ".num_attention_heads",
           fmt::format("a multiple of {}.num_key_value_heads ({})", sec, s.num_key_value_heads),
           std::to_string(s.num_attention_heads));
    if (s.head_dim % 2 != 0)
      fail(sec + ".head_dim", "an even number (RoPE rotates halves)", std::to_string(s.head_dim));
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
  if (t.source == "fixture" || native_architecture(t.architecture))
    ck.one_of("target.architecture", t.architecture, {"qwen3", "llama"});
  else if (t.architecture.empty())
    ck.fail("target.architecture", "the hf model_type", "an empty string");
  if (native_architecture(t.architecture))
    ck.one_of("target.rope_type", t.shape.rope_scaling.type, {"", "llama3"});
  if (t.shape.rope_scaling.type == "llama3" &&
      !(t.shape.rope_scaling.high_freq_factor > t.shape.rope_scaling.low_freq_factor))
    ck.fail("target.rope_high_freq_factor",
            fmt::format("more than target.rope_low_freq_factor ({})",
                        t.shape.rope_scaling.low_freq_factor),
            fmt::format("{}", t.shape.rope_scaling.high_freq_factor));
  ck.shape("target", t.shape);

  const auto& d = c.drafter;
  ck.shape("drafter", d.shape);
  if (d.shape.hidden_size != t.shape.hidden_size)
    ck.fail("drafter.hidden_size",
            fmt::format("target.hidden_size ({}): the drafter shares the target's embedding "
                        "and LM head",
                        t.shape.hidden_size),
            std::to_string(d.shape.hidden_size));
  const std::string taps =
      tap_rule_violation(d.target_layer_ids, t.num_hidden_layers, d.allow_last_layer_tap);
  if (!taps.empty())
    throw ConfigError(fmt::format("{}: drafter.target_layer_ids: {}",
                                  c.path.empty() ? "<config>" : c.path, taps));
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

// Text is byte-tokenized (core/byte_tokenizer.h): ids 0..255 are bytes.
void check_text_data(const Checker& ck, const Config& c) {
  const auto& d = c.data;
  if (!d.byte_text()) return;
  if (c.target.vocab_size < 257)
    ck.fail("target.vocab_size", "at least 257 for byte-tokenized text (256 bytes + mask)",
            std::to_string(c.target.vocab_size));
  if (d.mask_token_id < 256)
    ck.fail("data.mask_token_id", "an id >= 256 for byte-tokenized text (0..255 are bytes)",
            std::to_string(d.mask_token_id));
}

// The objectives and their weighting (docs/LOSSES.md). A key that only one
// weighting reads is an error under another, never silently ignored.
void check_loss(const Checker& ck, const LossConfig& l) {
  if (l.ce_weight == 0 && !l.uses_teacher())
    ck.fail("loss.ce_weight",
            "ce_weight, kl_weight, reverse_kl_weight, jsd_weight or tv_weight > 0 (the loss would "
            "be identically 0)",
            "all 0");
  if (l.weighting != Weighting::kDecay && l.gamma != 0)
    ck.fail("loss.gamma",
            fmt::format("0 with weighting = \"{}\" (gamma is the decay of weighting = \"decay\")",
                        weighting_name(l.weighting)),
            fmt::format("{}", l.gamma));
  if (l.weighting != Weighting::kDpace && l.dpace_alpha != 0.5)
    ck.fail("loss.dpace_alpha",
            fmt::format("unset with weighting = \"{}\" (it is read by weighting = \"dpace\")",
                        weighting_name(l.weighting)),
            fmt::format("{}", l.dpace_alpha));
}

void check_data_loss_run(const Checker& ck, const Config& c) {
  const auto& d = c.data;
  ck.one_of("data.source", d.source,
            {"fixture", "inline", "jsonl", "shards", "features", "self_distill", "text"});
  const bool needs_path =
      d.source == "jsonl" || d.source == "shards" || d.source == "features" || d.source == "text";
  if (needs_path && d.path.empty())
    ck.fail("data.path", "a file or directory for data.source = \"" + d.source + "\"", "nothing");
  if (!needs_path && d.source != "self_distill" && !d.path.empty())
    ck.fail("data.path",
            "no path unless data.source is jsonl, shards, features, text or self_distill",
            "\"" + d.path + "\"");
  if (d.source == "self_distill" && d.path.empty() && !d.eval_path.empty())
    ck.fail("data.eval_path",
            "no eval_path for self_distill without data.path (seeded prompts have no file)",
            "\"" + d.eval_path + "\"");
  check_text_data(ck, c);
  if (d.source == "self_distill" && (d.prompt_len < 1 || d.prompt_len > d.seq_len - 2))
    ck.fail("data.prompt_len", fmt::format("in [1, data.seq_len - 2 = {}]", d.seq_len - 2),
            std::to_string(d.prompt_len));
  if (d.mask_token_id < 0 || d.mask_token_id >= c.target.vocab_size)
    ck.fail("data.mask_token_id",
            fmt::format("a token id in [0, target.vocab_size = {})", c.target.vocab_size),
            std::to_string(d.mask_token_id));

  check_inline_rows(ck, c);

  check_loss(ck, c.loss);

  ck.one_of("optimized.kernels", c.optimized.kernels, {"auto", "host", "aten"});
  ck.one_of("train.report_to", c.train.report_to, {"tensorboard", "none"});
  if (c.optimized.kernels == "host" && c.topology.device != "cpu")
    ck.fail("optimized.kernels",
            fmt::format("\"aten\" or \"auto\" with topology.device = \"{}\" (the host kernels "
                        "run on CPU tensors only)",
                        c.topology.device),
            "\"host\"");
}

}  // namespace

bool is_device_name(const std::string& name) {
  if (name == "cpu" || name == "cuda") return true;
  if (name.rfind("cuda:", 0) != 0 || name.size() < 6 || name.size() > 9) return false;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return std::stoi(name.substr(5)) < 1024 && (name.size() == 6 || name[5] != '0');
}

namespace {

void check_topology(const Checker& ck, const Config& c) {
  const auto& tp = c.topology;
  if (!is_device_name(tp.device))
    ck.fail("topology.device", "\"cpu\", \"cuda\" or \"cuda:N\" (N a device index < 1024)",
            "\"" + tp.device + "\"");
  ck.ranks("topology.target_ranks", tp.target_ranks, tp.world_size);
  ck.ranks("topology.drafter_ranks", tp.drafter_ranks, tp.world_size);
  if (tp.drafter_ranks.empty())
    ck.fail("topology.drafter_ranks", "at least one drafter rank", "an empty list");
  // Features carry the target's outputs: the drafters then read them alone.
  if (tp.target_ranks.empty() && !(tp.world_size > 1 && c.data.source == "features"))
    ck.fail("topology.target_ranks",
            "at least one target rank (none only with data.source = \"features\" and "
            "world_size > 1: every drafter rank then reads the features itself)",
            "an empty list");
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
  if (!tp.device_memory_gb.empty()) {
    if (int64_t(tp.device_memory_gb.size()) != tp.world_size)
      ck.fail("topology.device_memory_gb",
              fmt::format("one number, or one per rank ({})", tp.world_size),
              fmt::format("{} numbers", tp.device_memory_gb.size()));
  }
}

// The products that size tensors, computed in long double so that they
// cannot wrap: every element count must stay below 2^60 (its float64 bytes
// then fit int64), and the model below 2^40 parameters.
void check_products(const Checker& ck, const Config& c) {
  using LD = long double;
  auto layer = [](const LayerShape& s) {
    const LD H = s.hidden_size, q = LD(s.num_attention_heads) * s.head_dim,
             kv = LD(s.num_key_value_heads) * s.head_dim;
    return 2 * H * q + 2 * H * kv + 3 * H * s.intermediate_size + 2 * H + 2 * LD(s.head_dim);
  };
  const auto& t = c.target;
  const LD H = t.shape.hidden_size, V = t.vocab_size;
  const LD params = V * H * (t.tie_word_embeddings ? 1 : 2) + t.num_hidden_layers * layer(t.shape) +
                    c.drafter.num_hidden_layers * layer(c.drafter.shape) + c.num_taps() * H * H;
  if (params > LD(1ull << 40))
    ck.fail("parameters", "at most 2^40 (V*H*2 + Nt*layer(target) + Nd*layer(drafter) + L*H*H)",
            fmt::format("{:.3g}", double(params)));
  const auto& d = c.data;
  const LD B = d.batch_size, S = d.seq_len, Q = LD(d.max_anchors) * d.block_size;
  const LD chunk =
      c.optimized.target_query_chunk > 0 ? std::min<LD>(c.optimized.target_query_chunk, S) : S;
  const struct {
    const char* what;
    LD elements;
  } sizes[] = {
      {"target logits B*S*V", B * S * V},
      {"draft logits B*Q*V (Q = max_anchors*block_size)", B * Q * V},
      {"target attention scores B*nh*chunk*S", B * t.shape.num_attention_heads * chunk * S},
      {"drafter attention scores B*nh*Q*(S+Q)",
       B * c.drafter.shape.num_attention_heads * Q * (S + Q)},
  };
  for (const auto& s : sizes)
    if (s.elements >= LD(1ull << 60))
      ck.fail("data.batch_size",
              fmt::format("tensor sizes below 2^60 elements ({} would be {:.3g})", s.what,
                          double(s.elements)),
              fmt::format("B = {}, S = {}, Q = {}, V = {}", d.batch_size, d.seq_len, int64_t(Q),
                          t.vocab_size));
}

// Every number in its documented range (config_fields()), before any rule
// between keys reads it.
void check_ranges(const Checker& ck, const Config& c) {
  using Type = ConfigField::Type;
  for (const ConfigField& f : config_fields()) {
    if (!f.range || f.need == ConfigField::Need::kHfOnly) continue;
    const void* p = f.in(c);
    if (f.type == Type::kInt) ck.in_range(f.key, *static_cast<const int64_t*>(p));
    if (f.type == Type::kReal) ck.in_range(f.key, *static_cast<const double*>(p));
    if (f.type == Type::kReals)
      for (double x : *static_cast<const std::vector<double>*>(p)) ck.in_range(f.key, x);
  }
}

}  // namespace

void validate_config(const Config& c) {
  Checker ck(c);
  check_ranges(ck, c);
  check_model(ck, c);
  check_data_loss_run(ck, c);
  check_topology(ck, c);
  check_products(ck, c);
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
