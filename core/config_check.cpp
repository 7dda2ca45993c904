// Value and cross-field rules for Config, and its resolved JSON/TOML forms.
// Every number is held to a documented range (config_ranges(), listed in
// docs/CONFIG.md) before anything sizes memory by it, and the products that
// size tensors are checked for int64 overflow.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/config.h"

namespace dflash {

namespace {

constexpr double kNoLimit = std::numeric_limits<double>::infinity();

ConfigRange ints(const char* key, int64_t lo, int64_t hi, const char* why) {
  return {key, double(lo), double(hi), true, false, false, why};
}
ConfigRange reals(const char* key, double lo, double hi, bool lo_open, bool hi_open,
                  const char* why) {
  return {key, lo, hi, false, lo_open, hi_open, why};
}

// Shape rows, once per section (the drafter's default to the target's).
void add_shape_ranges(std::vector<ConfigRange>& v, bool target) {
  const char* p = target ? "target." : "drafter.";
  static std::vector<std::string> keys;  // owns the composed key strings
  auto k = [&](const char* name) {
    keys.push_back(std::string(p) + name);
    return keys.back().c_str();
  };
  keys.reserve(32);
  v.push_back(ints(k("hidden_size"), 1, 65536, "H; 2^16, 8x the largest open models"));
  v.push_back(ints(k("num_attention_heads"), 1, 1024, "nh"));
  v.push_back(ints(k("num_key_value_heads"), 1, 1024, "nkv, divides nh"));
  v.push_back(ints(k("head_dim"), 2, 1024, "hd, even (RoPE rotates halves)"));
  v.push_back(ints(k("intermediate_size"), 1, 1 << 20, "I"));
  v.push_back(reals(k("rope_theta"), 0, 1e12, true, false, "RoPE base"));
  v.push_back(reals(k("rms_norm_eps"), 0, 1, true, false, "RMSNorm epsilon"));
  v.push_back(reals(k("init_std"), 0, 10, false, false, "fixture init"));
  v.push_back(reals(k("norm_init_jitter"), 0, 10, false, false, "fixture init"));
}

std::vector<ConfigRange> make_ranges() {
  std::vector<ConfigRange> v;
  v.push_back(ints("target.vocab_size", 2, 1 << 24, "V; 2^24, 64x a 250k vocabulary"));
  v.push_back(ints("target.num_hidden_layers", 1, 1024, "Nt"));
  v.push_back(ints("target.max_position_embeddings", 1, 1'000'000'000'000,
                   "read from an hf target's config.json (the served context limit)"));
  add_shape_ranges(v, true);
  v.push_back(ints("drafter.num_hidden_layers", 1, 256, "Nd"));
  add_shape_ranges(v, false);
  v.push_back(ints("data.batch_size", 1, 65536, "B"));
  v.push_back(ints("data.seq_len", 2, 1 << 22, "S; 4M tokens"));
  v.push_back(ints("data.block_size", 2, 4096, "bs"));
  v.push_back(ints("data.max_anchors", 1, 1 << 20, "N"));
  v.push_back(ints("data.eval_samples", 0, INT32_MAX, "held-out samples"));
  v.push_back(ints("data.num_samples", 1, INT32_MAX, "self_distill samples"));
  v.push_back(ints("data.prompt_len", 1, 1 << 22, "self_distill: also <= seq_len - 2"));
  v.push_back(reals("loss.ce_weight", 0, 1e6, false, false, ""));
  v.push_back(reals("loss.kl_weight", 0, 1e6, false, false, ""));
  v.push_back(reals("loss.temperature", 0, 1e4, true, false, "T"));
  v.push_back(reals("loss.gamma", 0, 1e6, false, false, "0 = no decay"));
  v.push_back(ints("loss.chunk_size", 0, 1 << 22, "0 = whole Q"));
  v.push_back(reals("loss.reverse_kl_weight", 0, 1e6, false, false, ""));
  v.push_back(reals("loss.jsd_weight", 0, 1e6, false, false, ""));
  v.push_back(reals("loss.jsd_beta", 0, 1, false, false, "0 = forward KL, 1 = reverse KL"));
  v.push_back(reals("loss.tv_weight", 0, 1e6, false, false, ""));
  v.push_back(reals("loss.dpace_alpha", 0, 1, true, false, "weighting = \"dpace\" only"));
  v.push_back(ints("run.threads", 0, 4096, "0 = OMP_NUM_THREADS or the cores"));
  v.push_back(ints("optimized.attention_tile", 1, 1 << 20, "key tile"));
  v.push_back(ints("optimized.target_query_chunk", 0, 1 << 22, "0 = dense"));
  v.push_back(ints("topology.world_size", 1, 65536, "ranks"));
  v.push_back(reals("topology.device_memory_gb", 0, 1e6, true, false, "decimal GB per rank"));
  v.push_back(reals("topology.memory_reserve_gb", 0, 1e6, false, false, "decimal GB"));
  v.push_back(reals("topology.timeout_s", 0, 1e7, true, false, "seconds"));
  v.push_back(reals("topology.startup_timeout_s", 0, 1e7, true, false, "seconds"));
  v.push_back(ints("topology.queue_depth", 1, 1024, "micro-batches"));
  v.push_back(ints("train.steps", 1, 1'000'000'000'000, ""));
  v.push_back(ints("train.micro_batches", 1, 65536, ""));
  v.push_back(reals("train.lr", 0, 10, true, false, ""));
  v.push_back(ints("train.warmup_steps", 0, 1'000'000'000'000, ""));
  v.push_back(reals("train.min_lr_ratio", 0, 1, false, false, ""));
  v.push_back(reals("train.weight_decay", 0, 1e3, false, false, ""));
  v.push_back(reals("train.clip_norm", 0, 1e9, false, false, "0 = no clipping"));
  v.push_back(reals("train.beta1", 0, 1, false, true, ""));
  v.push_back(reals("train.beta2", 0, 1, false, true, ""));
  v.push_back(ints("train.eval_every", 0, 1'000'000'000'000, "0 = only at the end"));
  v.push_back(ints("train.eval_batches", 1, 1'000'000, ""));
  v.push_back(ints("train.checkpoint_every", 0, 1'000'000'000'000, "0 = only at the end"));
  v.push_back(ints("train.keep_checkpoints", 1, 1'000'000, ""));
  v.push_back(ints("train.log_every", 1, 1'000'000'000'000, ""));
  v.push_back(
      ints("train.served_eval_every", 0, 1'000'000'000'000, "0 = at the start and the end only"));
  v.push_back(ints("train.served_eval_prompts", 0, 65536, "0 = no served evaluation"));
  v.push_back(ints("train.served_eval_tokens", 1, 1'000'000, ""));
  v.push_back(ints("train.served_tree_budget", 1, 4096, ""));
  return v;
}

std::string number_text(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::fabs(x) < 1e15) return fmt::format("{}", int64_t(x));
  return fmt::format("{}", x);
}

}  // namespace

bool ConfigRange::contains(double v) const {
  if (std::isnan(v)) return false;
  const bool lo_ok = lo_open ? v > lo : v >= lo;
  const bool hi_ok = hi_open ? v < hi : v <= hi;
  return lo_ok && hi_ok;
}

bool ConfigRange::contains_int(int64_t v) const {
  return v >= int64_t(lo) && v <= int64_t(hi);  // bounds are < 2^53: exact
}

std::string ConfigRange::text() const {
  return fmt::format("{}{}, {}{}", lo_open ? "(" : "[", number_text(lo), number_text(hi),
                     hi_open ? ")" : "]");
}

const std::vector<ConfigRange>& config_ranges() {
  static const std::vector<ConfigRange> ranges = make_ranges();
  return ranges;
}

const ConfigRange& config_range(const std::string& key) {
  for (const ConfigRange& r : config_ranges())
    if (key == r.key) return r;
  throw std::logic_error("config_range: no range for " + key);
}

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
    in_range(sec + ".hidden_size", s.hidden_size);
    in_range(sec + ".num_attention_heads", s.num_attention_heads);
    in_range(sec + ".num_key_value_heads", s.num_key_value_heads);
    if (s.num_attention_heads % s.num_key_value_heads != 0)
      fail(sec + ".num_attention_heads",
           fmt::format("a multiple of {}.num_key_value_heads ({})", sec, s.num_key_value_heads),
           std::to_string(s.num_attention_heads));
    in_range(sec + ".head_dim", s.head_dim);
    if (s.head_dim % 2 != 0)
      fail(sec + ".head_dim", "an even number (RoPE rotates halves)", std::to_string(s.head_dim));
    in_range(sec + ".intermediate_size", s.intermediate_size);
    in_range(sec + ".rope_theta", s.rope_theta);
    in_range(sec + ".rms_norm_eps", s.rms_norm_eps);
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
  ck.in_range("target.vocab_size", t.vocab_size);
  ck.in_range("target.num_hidden_layers", t.num_hidden_layers);
  ck.shape("target", t.shape);
  ck.in_range("target.init_std", t.init_std);
  ck.in_range("target.norm_init_jitter", t.norm_init_jitter);

  const auto& d = c.drafter;
  ck.in_range("drafter.num_hidden_layers", d.num_hidden_layers);
  ck.shape("drafter", d.shape);
  if (d.shape.hidden_size != t.shape.hidden_size)
    ck.fail("drafter.hidden_size",
            fmt::format("target.hidden_size ({}): the drafter shares the target's embedding "
                        "and LM head",
                        t.shape.hidden_size),
            std::to_string(d.shape.hidden_size));
  if (d.target_layer_ids.empty())
    ck.fail("drafter.target_layer_ids", "at least one tapped layer", "an empty list");
  if (int64_t(d.target_layer_ids.size()) > t.num_hidden_layers)
    ck.fail("drafter.target_layer_ids",
            fmt::format("at most target.num_hidden_layers = {} ids", t.num_hidden_layers),
            fmt::format("{} ids", d.target_layer_ids.size()));
  for (int64_t id : d.target_layer_ids)
    if (id < 0 || id >= t.num_hidden_layers)
      ck.fail("drafter.target_layer_ids",
              fmt::format("layer ids in [0, {}) (target.num_hidden_layers = {}; the default "
                          "rule spreads them over [1, Nt-3], so small targets need explicit ids)",
                          t.num_hidden_layers, t.num_hidden_layers),
              fmt::format("[{}]", fmt::join(d.target_layer_ids, ", ")));
  ck.in_range("drafter.init_std", d.init_std);
  ck.in_range("drafter.norm_init_jitter", d.norm_init_jitter);
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
  for (const auto& [key, v] :
       {std::pair<const char*, double>{"loss.ce_weight", l.ce_weight},
        {"loss.kl_weight", l.kl_weight},
        {"loss.reverse_kl_weight", l.reverse_kl_weight},
        {"loss.jsd_weight", l.jsd_weight},
        {"loss.tv_weight", l.tv_weight}})
    ck.in_range(key, v);
  if (l.ce_weight == 0 && !l.uses_teacher())
    ck.fail("loss.ce_weight",
            "ce_weight, kl_weight, reverse_kl_weight, jsd_weight or tv_weight > 0 (the loss would "
            "be identically 0)",
            "all 0");
  ck.in_range("loss.jsd_beta", l.jsd_beta);
  ck.in_range("loss.temperature", l.temperature);
  ck.in_range("loss.gamma", l.gamma);
  ck.in_range("loss.chunk_size", l.chunk_size);
  ck.in_range("loss.dpace_alpha", l.dpace_alpha);
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
  ck.in_range("data.eval_samples", d.eval_samples);
  ck.in_range("data.num_samples", d.num_samples);
  ck.in_range("data.prompt_len", d.prompt_len);
  if (d.source == "self_distill" && (d.prompt_len < 1 || d.prompt_len > d.seq_len - 2))
    ck.fail("data.prompt_len", fmt::format("in [1, data.seq_len - 2 = {}]", d.seq_len - 2),
            std::to_string(d.prompt_len));
  ck.in_range("data.batch_size", d.batch_size);
  ck.in_range("data.seq_len", d.seq_len);
  ck.in_range("data.block_size", d.block_size);
  ck.in_range("data.max_anchors", d.max_anchors);
  if (d.mask_token_id < 0 || d.mask_token_id >= c.target.vocab_size)
    ck.fail("data.mask_token_id",
            fmt::format("a token id in [0, target.vocab_size = {})", c.target.vocab_size),
            std::to_string(d.mask_token_id));

  check_inline_rows(ck, c);

  const auto& l = c.loss;
  check_loss(ck, c.loss);

  ck.in_range("run.threads", c.run.threads);
  ck.in_range("optimized.attention_tile", c.optimized.attention_tile);
  ck.in_range("optimized.target_query_chunk", c.optimized.target_query_chunk);
  ck.one_of("optimized.kernels", c.optimized.kernels, {"auto", "host", "aten"});
  if (c.optimized.kernels == "host" && c.topology.device != "cpu")
    ck.fail("optimized.kernels",
            fmt::format("\"aten\" or \"auto\" with topology.device = \"{}\" (the host kernels "
                        "run on CPU tensors only)",
                        c.topology.device),
            "\"host\"");
}

void check_train(const Checker& ck, const TrainConfig& t) {
  ck.in_range("train.steps", t.steps);
  ck.in_range("train.micro_batches", t.micro_batches);
  ck.in_range("train.lr", t.lr);
  ck.in_range("train.warmup_steps", t.warmup_steps);
  ck.in_range("train.min_lr_ratio", t.min_lr_ratio);
  ck.in_range("train.weight_decay", t.weight_decay);
  ck.in_range("train.clip_norm", t.clip_norm);
  ck.in_range("train.beta1", t.beta1);
  ck.in_range("train.beta2", t.beta2);
  ck.in_range("train.eval_every", t.eval_every);
  ck.in_range("train.eval_batches", t.eval_batches);
  ck.in_range("train.checkpoint_every", t.checkpoint_every);
  ck.in_range("train.keep_checkpoints", t.keep_checkpoints);
  ck.in_range("train.log_every", t.log_every);
  ck.in_range("train.served_eval_every", t.served_eval_every);
  ck.in_range("train.served_eval_prompts", t.served_eval_prompts);
  ck.in_range("train.served_eval_tokens", t.served_eval_tokens);
  ck.in_range("train.served_tree_budget", t.served_tree_budget);
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
  ck.in_range("topology.world_size", tp.world_size);
  if (!is_device_name(tp.device))
    ck.fail("topology.device", "\"cpu\", \"cuda\" or \"cuda:N\" (N a device index < 1024)",
            "\"" + tp.device + "\"");
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
  ck.in_range("topology.memory_reserve_gb", tp.memory_reserve_gb);
  ck.in_range("topology.timeout_s", tp.timeout_s);
  ck.in_range("topology.startup_timeout_s", tp.startup_timeout_s);
  ck.in_range("topology.queue_depth", tp.queue_depth);
  if (!tp.device_memory_gb.empty()) {
    if (int64_t(tp.device_memory_gb.size()) != tp.world_size)
      ck.fail("topology.device_memory_gb",
              fmt::format("one number, or one per rank ({})", tp.world_size),
              fmt::format("{} numbers", tp.device_memory_gb.size()));
    for (double g : tp.device_memory_gb) ck.in_range("topology.device_memory_gb", g);
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

}  // namespace

void validate_config(const Config& c) {
  Checker ck(c);
  check_model(ck, c);
  check_data_loss_run(ck, c);
  check_topology(ck, c);
  check_train(ck, c.train);
  check_products(ck, c);
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
               {"chunk_size", c.loss.chunk_size},
               {"reverse_kl_weight", c.loss.reverse_kl_weight},
               {"jsd_weight", c.loss.jsd_weight},
               {"jsd_beta", c.loss.jsd_beta},
               {"tv_weight", c.loss.tv_weight},
               {"weighting", weighting_name(c.loss.weighting)},
               {"dpace_alpha", c.loss.dpace_alpha}};
  j["run"] = {{"seed", c.run.seed}, {"dtype", dtype_name(c.run.dtype)}, {"threads", c.run.threads}};
  j["optimized"] = {{"chunked_loss", c.optimized.chunked_loss},
                    {"sparse_attention", c.optimized.sparse_attention},
                    {"checkpoint_layers", c.optimized.checkpoint_layers},
                    {"attention_tile", c.optimized.attention_tile},
                    {"target_query_chunk", c.optimized.target_query_chunk},
                    {"kernels", c.optimized.kernels}};
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
                {"served_eval_every", tr.served_eval_every},
                {"served_eval_prompts", tr.served_eval_prompts},
                {"served_eval_tokens", tr.served_eval_tokens},
                {"served_tree_budget", tr.served_tree_budget},
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
