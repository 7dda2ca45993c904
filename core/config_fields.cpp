// The config's field table (config.h, ConfigField): one row per key, and
// what is derived from it: the ranges, the resolved JSON form and the
// docs/CONFIG.md key table.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>

#include "core/config.h"

namespace dflash {
namespace {

using Type = ConfigField::Type;
using Need = ConfigField::Need;
using Range = std::optional<ConfigRange>;

constexpr int64_t kTera = 1'000'000'000'000;

Range ints(int64_t lo, int64_t hi) {
  return ConfigRange{"", double(lo), double(hi), true, false, false};
}
Range reals(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  return ConfigRange{"", lo, hi, false, lo_open, hi_open};
}
Range weight() { return reals(0, 1e6); }

// Flags of a row.
constexpr unsigned kFromHf = 1;     // an hf target's config.json fills it
constexpr unsigned kOmitEmpty = 2;  // left out of the resolved form when at its default

#define DFLASH_AT(m) +[](Config& c) -> void* { return &c.m; }

struct Row {
  const char* key;
  Type type;
  void* (*at)(Config&);
  Need need;
  Range range;
  const char* doc;
  unsigned flags = 0;
};

// The shape keys of [target] (from an hf config.json, or required) and of
// [drafter] (the target's unless given).
void shape_rows(std::vector<Row>& v, bool target) {
  const Need need = target ? Need::kRequired : Need::kTargets;
  const Need fixed = target ? Need::kOptional : Need::kTargets;
  const unsigned hf = target ? kFromHf : 0;
  auto row = [&](const char* name, Type t, void* (*at_target)(Config&),
                 void* (*at_drafter)(Config&), Need n, Range r, const char* doc) {
    static std::deque<std::string> keys;  // owns the composed keys (never moved)
    keys.push_back(std::string(target ? "target." : "drafter.") + name);
    v.push_back({keys.back().c_str(), t, target ? at_target : at_drafter, n, r, doc, hf});
  };
  row("hidden_size", Type::kInt, DFLASH_AT(target.shape.hidden_size),
      DFLASH_AT(drafter.shape.hidden_size), need, ints(1, 65536),
      target ? "H (2^16 is 8x the largest open models)"
             : "H; equal to target.hidden_size (the drafter shares the embedding and LM head)");
  row("num_attention_heads", Type::kInt, DFLASH_AT(target.shape.num_attention_heads),
      DFLASH_AT(drafter.shape.num_attention_heads), need, ints(1, 1024),
      "nh, a multiple of num_key_value_heads");
  row("num_key_value_heads", Type::kInt, DFLASH_AT(target.shape.num_key_value_heads),
      DFLASH_AT(drafter.shape.num_key_value_heads), need, ints(1, 1024), "nkv (GQA)");
  row("head_dim", Type::kInt, DFLASH_AT(target.shape.head_dim), DFLASH_AT(drafter.shape.head_dim),
      need, ints(2, 1024), "hd, even (RoPE rotates halves)");
  row("intermediate_size", Type::kInt, DFLASH_AT(target.shape.intermediate_size),
      DFLASH_AT(drafter.shape.intermediate_size), need, ints(1, 1 << 20), "I (the SwiGLU MLP)");
  row("rope_theta", Type::kReal, DFLASH_AT(target.shape.rope_theta),
      DFLASH_AT(drafter.shape.rope_theta), fixed, reals(0, 1e12, true), "RoPE base");
  row("rms_norm_eps", Type::kReal, DFLASH_AT(target.shape.rms_norm_eps),
      DFLASH_AT(drafter.shape.rms_norm_eps), fixed, reals(0, 1, true), "RMSNorm epsilon");
}

void model_rows(std::vector<Row>& v) {
  v.push_back({"target.source",
               Type::kString,
               DFLASH_AT(target.source),
               Need::kOptional,
               {},
               "`fixture` (seeded init, core/init.h) or `hf` (a Hugging Face directory)"});
  v.push_back({"target.path",
               Type::kString,
               DFLASH_AT(target.path),
               Need::kWithHf,
               {},
               "with `source = \"hf\"`: a Hugging Face Qwen3 directory; its config.json fills "
               "the keys marked so, and any repeated here must agree (docs/TRAINING.md)",
               kOmitEmpty});
  v.push_back({"target.vocab_size", Type::kInt, DFLASH_AT(target.vocab_size), Need::kRequired,
               ints(2, 1 << 24),
               "V (2^24 is 64x a 250k vocabulary); >= 257 with byte-tokenized text", kFromHf});
  v.push_back({"target.num_hidden_layers", Type::kInt, DFLASH_AT(target.num_hidden_layers),
               Need::kRequired, ints(1, 1024), "Nt", kFromHf});
  shape_rows(v, true);
  v.push_back({"target.architecture",
               Type::kString,
               DFLASH_AT(target.architecture),
               Need::kOptional,
               {},
               "the Hugging Face model_type: `qwen3` or `llama` (no q/k norm) run natively; "
               "an hf target of any other type (e.g. `qwen3_5_text`) is run by transformers "
               "for `dflash features` and trained from them (docs/TRAINING.md)",
               kFromHf | kOmitEmpty});
  v.push_back({"target.rope_type",
               Type::kString,
               DFLASH_AT(target.shape.rope_scaling.type),
               Need::kOptional,
               {},
               "RoPE frequency scaling: empty (plain) or `llama3` (Llama 3.1's); the drafter's "
               "RoPE stays plain",
               kFromHf | kOmitEmpty});
  v.push_back({"target.rope_factor", Type::kReal, DFLASH_AT(target.shape.rope_scaling.factor),
               Need::kOptional, reals(1, 1e6), "llama3 RoPE: the low-frequency slow-down",
               kFromHf | kOmitEmpty});
  v.push_back({"target.rope_low_freq_factor", Type::kReal,
               DFLASH_AT(target.shape.rope_scaling.low_freq_factor), Need::kOptional,
               reals(0, 1e6, true), "llama3 RoPE: wavelengths past original/this are slowed",
               kFromHf | kOmitEmpty});
  v.push_back({"target.rope_high_freq_factor", Type::kReal,
               DFLASH_AT(target.shape.rope_scaling.high_freq_factor), Need::kOptional,
               reals(0, 1e6, true), "llama3 RoPE: wavelengths under original/this are kept",
               kFromHf | kOmitEmpty});
  v.push_back({"target.rope_original_max_position_embeddings", Type::kInt,
               DFLASH_AT(target.shape.rope_scaling.original_max_position_embeddings),
               Need::kOptional, ints(1, kTera), "llama3 RoPE: the pre-training context",
               kFromHf | kOmitEmpty});
  v.push_back({"target.tie_word_embeddings",
               Type::kBool,
               DFLASH_AT(target.tie_word_embeddings),
               Need::kOptional,
               {},
               "the LM head is the embedding",
               kFromHf});
  v.push_back({"target.init_std", Type::kReal, DFLASH_AT(target.init_std), Need::kOptional,
               reals(0, 10), "seeded init of a fixture target: N(0, init_std) weights"});
  v.push_back({"target.norm_init_jitter", Type::kReal, DFLASH_AT(target.norm_init_jitter),
               Need::kOptional, reals(0, 10), "seeded init: norms 1 + jitter N(0, 1)"});
  v.push_back({"target.max_position_embeddings", Type::kInt,
               DFLASH_AT(target.max_position_embeddings), Need::kHfOnly, ints(1, kTera),
               "not a key of the file: read from an hf target's config.json (the served "
               "context limit)"});
  v.push_back({"drafter.num_hidden_layers", Type::kInt, DFLASH_AT(drafter.num_hidden_layers),
               Need::kRequired, ints(1, 256), "Nd"});
  shape_rows(v, false);
  v.push_back({"drafter.target_layer_ids",
               Type::kInts,
               DFLASH_AT(drafter.target_layer_ids),
               Need::kRule,
               {},
               "the tapped target layers: distinct ids in [0, Nt), ascending, not Nt-1 "
               "(docs/SERVING.md); default: Nd ids spread over [1, Nt-3] (docs/SPEC.md)"});
  v.push_back({"drafter.allow_last_layer_tap",
               Type::kBool,
               DFLASH_AT(drafter.allow_last_layer_tap),
               Need::kOptional,
               {},
               "allow tapping the target's last layer Nt-1: SGLang cannot capture it and "
               "speculators' converter drops it, so `dflash export` refuses such a drafter"});
  v.push_back({"drafter.init_std", Type::kReal, DFLASH_AT(drafter.init_std), Need::kOptional,
               reals(0, 10), "seeded init: N(0, init_std) weights"});
  v.push_back({"drafter.norm_init_jitter", Type::kReal, DFLASH_AT(drafter.norm_init_jitter),
               Need::kOptional, reals(0, 10), "seeded init: norms 1 + jitter N(0, 1)"});
}

void data_rows(std::vector<Row>& v) {
  v.push_back({"data.source",
               Type::kString,
               DFLASH_AT(data.source),
               Need::kOptional,
               {},
               "`fixture` (seeded rows), `inline`, or for training `jsonl`, `shards`, "
               "`features`, `self_distill`, `text` (docs/TRAINING.md)"});
  v.push_back({"data.batch_size", Type::kInt, DFLASH_AT(data.batch_size), Need::kRequired,
               ints(1, 65536), "B"});
  v.push_back({"data.seq_len", Type::kInt, DFLASH_AT(data.seq_len), Need::kRequired,
               ints(2, 1 << 22), "S (4M tokens at most)"});
  v.push_back({"data.block_size", Type::kInt, DFLASH_AT(data.block_size), Need::kRequired,
               ints(2, 4096), "bs"});
  v.push_back({"data.max_anchors", Type::kInt, DFLASH_AT(data.max_anchors), Need::kRequired,
               ints(1, 1 << 20), "N, anchors per row at most"});
  v.push_back({"data.mask_token_id",
               Type::kInt,
               DFLASH_AT(data.mask_token_id),
               Need::kRequired,
               {},
               "in [0, vocab_size); >= 256 with byte-tokenized text (0..255 are bytes) and equal "
               "to an hf target's byte_tokenizer.json mask id"});
  v.push_back({"data.input_ids",
               Type::kRows,
               DFLASH_AT(data.input_ids),
               Need::kOptional,
               {},
               "only with `source = \"inline\"`: batch_size rows of seq_len ids (how `dflash "
               "parity` writes a counterexample)",
               kOmitEmpty});
  v.push_back({"data.loss_mask",
               Type::kRows,
               DFLASH_AT(data.loss_mask),
               Need::kOptional,
               {},
               "only with `source = \"inline\"`: rows of 0/1 like input_ids",
               kOmitEmpty});
  v.push_back({"data.path",
               Type::kString,
               DFLASH_AT(data.path),
               Need::kOptional,
               {},
               "required by `jsonl` (a file), `shards`, `features` (directories) and `text` (a "
               "UTF-8 file, `.jsonl` of `{\"text\"}`, or a directory); optional for "
               "`self_distill` (text the prompts are drawn from); not allowed otherwise",
               kOmitEmpty});
  v.push_back({"data.eval_path",
               Type::kString,
               DFLASH_AT(data.eval_path),
               Need::kOptional,
               {},
               "held-out data of the same kind (none: the last eval_samples are held out); with "
               "`self_distill`, text of the held-out prompts (needs data.path)",
               kOmitEmpty});
  v.push_back({"data.eval_samples", Type::kInt, DFLASH_AT(data.eval_samples), Need::kOptional,
               ints(0, INT32_MAX),
               "held-out samples (self_distill: generated from other prompts)"});
  v.push_back({"data.num_samples", Type::kInt, DFLASH_AT(data.num_samples), Need::kOptional,
               ints(1, INT32_MAX), "self_distill: training samples generated"});
  v.push_back({"data.prompt_len", Type::kInt, DFLASH_AT(data.prompt_len), Need::kOptional,
               ints(1, 1 << 22), "self_distill: prompt tokens (loss_mask 0), <= seq_len - 2"});
}

void loss_rows(std::vector<Row>& v) {
  v.push_back({"loss.ce_weight", Type::kReal, DFLASH_AT(loss.ce_weight), Need::kOptional, weight(),
               "CE against the hard label (docs/LOSSES.md); the five weights are not all 0"});
  v.push_back({"loss.kl_weight", Type::kReal, DFLASH_AT(loss.kl_weight), Need::kOptional, weight(),
               "forward KL(p_t \\|\\| p_s)"});
  v.push_back({"loss.temperature", Type::kReal, DFLASH_AT(loss.temperature), Need::kOptional,
               reals(0, 1e4, true), "T, both sides of every distillation term (not CE), no T^2"});
  v.push_back({"loss.gamma", Type::kReal, DFLASH_AT(loss.gamma), Need::kOptional, reals(0, 1e6),
               "decay exp(-(k-1)/gamma), 0 = no decay; 0 unless weighting = \"decay\""});
  v.push_back({"loss.chunk_size", Type::kInt, DFLASH_AT(loss.chunk_size), Need::kOptional,
               ints(0, 1 << 22), "rows per chunk of the optimized loss; 0 = whole Q"});
  v.push_back({"loss.reverse_kl_weight", Type::kReal, DFLASH_AT(loss.reverse_kl_weight),
               Need::kOptional, weight(), "reverse KL(p_s \\|\\| p_t)"});
  v.push_back({"loss.jsd_weight", Type::kReal, DFLASH_AT(loss.jsd_weight), Need::kOptional,
               weight(), "generalized JSD_beta"});
  v.push_back({"loss.jsd_beta", Type::kReal, DFLASH_AT(loss.jsd_beta), Need::kOptional, reals(0, 1),
               "mixture m = beta p_t + (1 - beta) p_s (TRL's convention); 0 is the forward KL, 1 "
               "the reverse KL"});
  v.push_back({"loss.tv_weight", Type::kReal, DFLASH_AT(loss.tv_weight), Need::kOptional, weight(),
               "total variation 1/2 sum \\|p_s - p_t\\|"});
  v.push_back({"loss.weighting",
               Type::kWeighting,
               DFLASH_AT(loss.weighting),
               Need::kOptional,
               {},
               "`decay` (SPEC step 8), `dpace` (D-PACE, detached acceptance-aware weights), "
               "`uniform` (every counted slot 1)"});
  v.push_back({"loss.dpace_alpha", Type::kReal, DFLASH_AT(loss.dpace_alpha), Need::kOptional,
               reals(0, 1, true),
               "D-PACE's smoothing (1 - alpha) q + alpha; only with "
               "weighting = \"dpace\""});
}

void run_rows(std::vector<Row>& v) {
  v.push_back({"run.seed",
               Type::kSeed,
               DFLASH_AT(run.seed),
               Need::kOptional,
               {},
               "an integer >= 0: every seeded stream derives from it"});
  v.push_back({"run.dtype",
               Type::kDType,
               DFLASH_AT(run.dtype),
               Need::kOptional,
               {},
               "`float32`, `float64`, `bfloat16` (the reference runs float32/float64)"});
  v.push_back({"run.threads", Type::kInt, DFLASH_AT(run.threads), Need::kOptional, ints(0, 4096),
               "intra-op threads; 0 = OMP_NUM_THREADS, else the core count"});
  v.push_back({"optimized.chunked_loss",
               Type::kBool,
               DFLASH_AT(optimized.chunked_loss),
               Need::kOptional,
               {},
               "fused chunked LM-head loss, else the full-logits loss"});
  v.push_back({"optimized.sparse_attention",
               Type::kBool,
               DFLASH_AT(optimized.sparse_attention),
               Need::kOptional,
               {},
               "tiled block-sparse attention, else dense masked attention"});
  v.push_back({"optimized.checkpoint_layers",
               Type::kBool,
               DFLASH_AT(optimized.checkpoint_layers),
               Need::kOptional,
               {},
               "recompute each drafter layer in backward"});
  v.push_back({"optimized.attention_tile", Type::kInt, DFLASH_AT(optimized.attention_tile),
               Need::kOptional, ints(1, 1 << 20), "key tile of the sparse attention"});
  v.push_back({"optimized.target_query_chunk", Type::kInt, DFLASH_AT(optimized.target_query_chunk),
               Need::kOptional, ints(0, 1 << 22),
               "the target forward's causal attention in query chunks of this many rows; 0 = "
               "dense (B, nh, S, S)"});
  v.push_back({"optimized.kernels",
               Type::kString,
               DFLASH_AT(optimized.kernels),
               Need::kOptional,
               {},
               "`host` (row kernels in plain C++, CPU tensors only), `aten` (ATen operations: "
               "the same code on CPU and CUDA), `auto` (host on CPU, aten on CUDA); docs/GPU.md"});
}

void topology_rows(std::vector<Row>& v) {
  v.push_back({"topology.world_size", Type::kInt, DFLASH_AT(topology.world_size), Need::kOptional,
               ints(1, 65536), "ranks"});
  v.push_back({"topology.target_ranks",
               Type::kInts,
               DFLASH_AT(topology.target_ranks),
               Need::kOptional,
               {},
               "in range, unique; with world_size > 1 disjoint from drafter_ranks and together "
               "covering every rank"});
  v.push_back({"topology.drafter_ranks",
               Type::kInts,
               DFLASH_AT(topology.drafter_ranks),
               Need::kOptional,
               {},
               "as target_ranks"});
  v.push_back({"topology.device",
               Type::kString,
               DFLASH_AT(topology.device),
               Need::kOptional,
               {},
               "`cpu`, `cuda` (a launched rank: `cuda:LOCAL_RANK`), `cuda:N`; `--device` "
               "overrides it (docs/GPU.md)"});
  v.push_back({"topology.device_memory_gb", Type::kReals, DFLASH_AT(topology.device_memory_gb),
               Need::kOptional, reals(0, 1e6, true),
               "decimal GB, one number or one per rank; none: the machine's RAM for a CPU run",
               kOmitEmpty});
  v.push_back({"topology.memory_reserve_gb", Type::kReal, DFLASH_AT(topology.memory_reserve_gb),
               Need::kOptional, reals(0, 1e6),
               "decimal GB kept free on every device; the planner says OOM above capacity "
               "minus this"});
  v.push_back({"topology.timeout_s", Type::kReal, DFLASH_AT(topology.timeout_s), Need::kOptional,
               reals(0, 1e7, true),
               "a transfer, collective or rendezvous waiting longer ends the run, naming the "
               "silent rank"});
  v.push_back({"topology.startup_timeout_s", Type::kReal, DFLASH_AT(topology.startup_timeout_s),
               Need::kOptional, reals(0, 1e7, true),
               "rendezvous and the config comparison wait this long for the slowest rank"});
  v.push_back({"topology.queue_depth", Type::kInt, DFLASH_AT(topology.queue_depth), Need::kOptional,
               ints(1, 1024), "micro-batches a target rank may run ahead of its drafter"});
}

void train_rows(std::vector<Row>& v) {
  auto row = [&](const char* key, Type t, void* (*at)(Config&), Range r, const char* doc) {
    v.push_back({key, t, at, Need::kOptional, r, doc});
  };
  row("train.steps", Type::kInt, DFLASH_AT(train.steps), ints(1, kTera), "optimizer steps");
  row("train.micro_batches", Type::kInt, DFLASH_AT(train.micro_batches), ints(1, 65536),
      "per step (gradient accumulation, normalised globally)");
  row("train.lr", Type::kReal, DFLASH_AT(train.lr), reals(0, 10, true), "peak learning rate");
  row("train.warmup_steps", Type::kInt, DFLASH_AT(train.warmup_steps), ints(0, kTera),
      "linear warmup, then cosine");
  row("train.min_lr_ratio", Type::kReal, DFLASH_AT(train.min_lr_ratio), reals(0, 1),
      "the cosine decays to lr * min_lr_ratio");
  row("train.weight_decay", Type::kReal, DFLASH_AT(train.weight_decay), reals(0, 1e3), "AdamW");
  row("train.clip_norm", Type::kReal, DFLASH_AT(train.clip_norm), reals(0, 1e9),
      "global gradient norm; 0 = no clipping");
  row("train.beta1", Type::kReal, DFLASH_AT(train.beta1), reals(0, 1, false, true), "AdamW");
  row("train.beta2", Type::kReal, DFLASH_AT(train.beta2), reals(0, 1, false, true), "AdamW");
  row("train.eval_every", Type::kInt, DFLASH_AT(train.eval_every), ints(0, kTera),
      "held-out evaluation, steps; 0 = only at the end");
  row("train.eval_batches", Type::kInt, DFLASH_AT(train.eval_batches), ints(1, 1'000'000),
      "held-out micro-batches per evaluation");
  row("train.checkpoint_every", Type::kInt, DFLASH_AT(train.checkpoint_every), ints(0, kTera),
      "steps; 0 = only at the end");
  row("train.keep_checkpoints", Type::kInt, DFLASH_AT(train.keep_checkpoints), ints(1, 1'000'000),
      "the newest kept");
  row("train.log_every", Type::kInt, DFLASH_AT(train.log_every), ints(1, kTera),
      "progress line, steps");
  row("train.served_eval_every", Type::kInt, DFLASH_AT(train.served_eval_every), ints(0, kTera),
      "served acceptance (docs/EVAL.md), steps; 0 = at the start and the end only");
  row("train.served_eval_prompts", Type::kInt, DFLASH_AT(train.served_eval_prompts), ints(0, 65536),
      "held-out prompts decoded; 0 = no served evaluation");
  row("train.served_eval_tokens", Type::kInt, DFLASH_AT(train.served_eval_tokens),
      ints(1, 1'000'000), "tokens generated per prompt");
  row("train.served_tree_budget", Type::kInt, DFLASH_AT(train.served_tree_budget), ints(1, 4096),
      "the tree decoding's node budget beside block decoding");
  row("train.report_to", Type::kString, DFLASH_AT(train.report_to), {},
      "`tensorboard`: every metrics.jsonl scalar also into TensorBoard event files in the run "
      "directory; `none`: metrics.jsonl only");
  row("train.out_dir", Type::kString, DFLASH_AT(train.out_dir), {},
      "the run directory; none: `runs/` and the config file's stem");
}

std::vector<ConfigField> make_fields() {
  std::vector<Row> rows;
  model_rows(rows);
  data_rows(rows);
  loss_rows(rows);
  run_rows(rows);
  topology_rows(rows);
  train_rows(rows);
  std::vector<ConfigField> out;
  for (Row& r : rows) {
    if (r.range) r.range->key = r.key;
    out.push_back({r.key, r.type, r.at, r.need, (r.flags & kFromHf) != 0,
                   (r.flags & kOmitEmpty) != 0, r.range, r.doc});
  }
  return out;
}

#undef DFLASH_AT

std::string number_text(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::fabs(x) < 1e15) return fmt::format("{}", int64_t(x));
  return fmt::format("{}", x);
}

// The default column of the docs table.
std::string default_text(const ConfigField& f) {
  switch (f.need) {
    case Need::kRequired:
      return f.from_hf ? "required (hf: config.json)" : "required";
    case Need::kTargets:
      return "the target's";
    case Need::kRule:
      return "SPEC rule";
    case Need::kWithHf:
      return "none (hf: required)";
    case Need::kHfOnly:
      return "config.json";
    case Need::kOptional:
      break;
  }
  const nlohmann::json j = field_json(f, Config());
  if (j.is_null() || (j.is_string() && j.get<std::string>().empty()) || (j.is_array() && j.empty()))
    return "none";
  return "`" + (j.is_number_float() ? number_text(j.get<double>()) : j.dump()) + "`";
}

}  // namespace

const void* ConfigField::in(const Config& c) const { return member(const_cast<Config&>(c)); }

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = make_fields();
  return fields;
}

const ConfigField& config_field(const std::string& key) {
  for (const ConfigField& f : config_fields())
    if (key == f.key) return f;
  throw std::logic_error("config_field: no field " + key);
}

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
  static const std::vector<ConfigRange> ranges = [] {
    std::vector<ConfigRange> v;
    for (const ConfigField& f : config_fields())
      if (f.range) v.push_back(*f.range);
    return v;
  }();
  return ranges;
}

const ConfigRange& config_range(const std::string& key) {
  const ConfigField& f = config_field(key);
  if (!f.range) throw std::logic_error("config_range: no range for " + key);
  return *f.range;
}

nlohmann::json field_json(const ConfigField& f, const Config& c) {
  const void* p = f.in(c);
  switch (f.type) {
    case Type::kInt:
      return *static_cast<const int64_t*>(p);
    case Type::kReal:
      return *static_cast<const double*>(p);
    case Type::kBool:
      return *static_cast<const bool*>(p);
    case Type::kString:
      return *static_cast<const std::string*>(p);
    case Type::kInts:
      return *static_cast<const std::vector<int64_t>*>(p);
    case Type::kReals:
      return *static_cast<const std::vector<double>*>(p);
    case Type::kRows:
      return *static_cast<const std::vector<std::vector<int64_t>>*>(p);
    case Type::kSeed:
      return *static_cast<const uint64_t*>(p);
    case Type::kDType:
      return dtype_name(*static_cast<const DType*>(p));
    case Type::kWeighting:
      return weighting_name(*static_cast<const Weighting*>(p));
  }
  return nullptr;
}

nlohmann::json config_to_json(const Config& c) {
  static const Config kDefault;
  nlohmann::json j;
  for (const ConfigField& f : config_fields()) {
    if (f.need == Need::kHfOnly) continue;
    nlohmann::json v = field_json(f, c);
    if (f.omit_empty && v == field_json(f, kDefault)) continue;
    const char* dot = std::strchr(f.key, '.');
    j[std::string(f.key, dot)][dot + 1] = std::move(v);
  }
  return j;
}

std::string config_fields_markdown() {
  std::string out = "| key | default | range | rule |\n|---|---|---|---|\n";
  for (const ConfigField& f : config_fields())
    out += fmt::format("| `{}` | {} | {} | {} |\n", f.key, default_text(f),
                       f.range ? f.range->text() : "", f.doc);
  return out;
}

}  // namespace dflash
