// The run configuration: TOML on disk (toml++), validated field by field.
// Key names follow SPEC.md and the Hugging Face Qwen3 config (hidden_size,
// num_attention_heads, ...). Every rejected value raises ConfigError with a
// message naming the file, the key, what was expected and what was found.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dflash {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class DType { kFloat32, kFloat64, kBFloat16 };
const char* dtype_name(DType d);

// RoPE frequency scaling of a Hugging Face config.json (rope_parameters /
// rope_scaling): type "" is plain RoPE; "llama3" is Llama 3.1's (wavelengths
// past original/low_freq_factor slowed by `factor`, a smooth ramp between).
struct RopeScaling {
  std::string type;  // "" or "llama3"
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Attention/MLP shape shared by target and drafter decoder layers.
struct LayerShape {
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;  // nh
  int64_t num_key_value_heads = 0;  // nkv, nh % nkv == 0
  int64_t head_dim = 0;             // hd, even (RoPE halves)
  int64_t intermediate_size = 0;    // I
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-6;
  bool qk_norm = true;       // per-head RMSNorm of q and k (Qwen3); false: Llama
  RopeScaling rope_scaling;  // the target's only; a drafter's RoPE is plain
};

struct TargetConfig {
  std::string source = "fixture";  // "fixture": seeded init (fixtures/); "hf": see path
  // The Hugging Face model_type. dflash runs "qwen3" and "llama" itself; any
  // other (an hf target only, e.g. "qwen3_5_text") is run by transformers
  // for `dflash features`, and training reads those features.
  std::string architecture = "qwen3";
  int64_t vocab_size = 0;         // V
  int64_t num_hidden_layers = 0;  // Nt
  LayerShape shape;
  bool tie_word_embeddings = false;
  double init_std = 0.02;               // fixture init: N(0, init_std) weights
  double norm_init_jitter = 0.0;        // fixture init: norms 1 + jitter*N(0,1)
  std::string path;                     // source = "hf": a Hugging Face model directory
  int64_t max_position_embeddings = 0;  // hf: config.json's context limit; 0 = not stated
};

struct DrafterConfig {
  int64_t num_hidden_layers = 0;          // Nd
  LayerShape shape;                       // hidden_size == target's
  std::vector<int64_t> target_layer_ids;  // L tapped target layers, ascending
  bool allow_last_layer_tap = false;      // opt in to tapping layer Nt-1 (not servable)
  double init_std = 0.02;
  double norm_init_jitter = 0.0;
};

struct DataConfig {
  std::string source = "fixture";               // "fixture": seeded prompt/response rows;
                                                // "inline": the rows below (the same every step)
  int64_t batch_size = 0;                       // B
  int64_t seq_len = 0;                          // S
  int64_t block_size = 0;                       // bs >= 2
  int64_t max_anchors = 0;                      // upper bound on N
  int64_t mask_token_id = 0;                    // < vocab_size
  std::vector<std::vector<int64_t>> input_ids;  // inline only: (B, S) token ids
  std::vector<std::vector<int64_t>> loss_mask;  // inline only: (B, S) 0 or 1
  // Sample sources for training (docs/TRAINING.md): "jsonl" (a file),
  // "shards" (a directory of safetensors), "features" (dflash features output),
  // "self_distill" (greedy continuations of seeded prompts by the target).
  std::string path;           // jsonl file, shards or features directory
  std::string eval_path;      // held-out data of the same kind ("" = hold out eval_samples)
  int64_t eval_samples = 32;  // held-out samples when no eval_path
  int64_t num_samples = 512;  // self_distill: training samples to generate
  int64_t prompt_len = 8;     // self_distill: prompt tokens before the continuation

  // Whether the data is byte-tokenized text (core/byte_tokenizer.h): the
  // text source, or self-distillation with prompts drawn from text.
  bool byte_text() const { return source == "text" || (source == "self_distill" && !path.empty()); }

  // The batch fields, the rest at their defaults (configs built in code).
  static DataConfig batch(std::string source, int64_t batch_size, int64_t seq_len,
                          int64_t block_size, int64_t max_anchors, int64_t mask_token_id) {
    DataConfig d;
    d.source = std::move(source);
    d.batch_size = batch_size, d.seq_len = seq_len, d.block_size = block_size;
    d.max_anchors = max_anchors, d.mask_token_id = mask_token_id;
    return d;
  }
};

// The training run ([train]); `dflash train` flags override these.
struct TrainConfig {
  int64_t steps = 100;
  int64_t micro_batches = 1;  // gradient accumulation, normalised globally
  double lr = 3e-4;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  double weight_decay = 0.0;
  double clip_norm = 1.0;
  double beta1 = 0.9, beta2 = 0.95;
  int64_t eval_every = 50;  // steps; 0 = only at the end
  int64_t eval_batches = 4;
  int64_t checkpoint_every = 50;
  int64_t keep_checkpoints = 2;
  int64_t log_every = 10;
  // Served acceptance (docs/EVAL.md): speculative decoding of held-out prompts.
  int64_t served_eval_every = 0;          // steps; 0 = at the start and the end only
  int64_t served_eval_prompts = 8;        // held-out prompts decoded; 0 = no served evaluation
  int64_t served_eval_tokens = 64;        // tokens generated per prompt
  int64_t served_tree_budget = 16;        // the tree decoding's node budget beside block decoding
  std::string report_to = "tensorboard";  // metrics also to: "tensorboard" or "none"
  std::string out_dir;                    // "" = runs/<config file stem>
};

// How the loss weight of slot k is chosen (docs/LOSSES.md): decay
// exp(-(k-1)/gamma) (SPEC step 8), D-PACE (acceptance-aware, detached, from
// the drafter's own confidence; arXiv 2605.18810) or uniform.
enum class Weighting { kDecay, kDpace, kUniform };
const char* weighting_name(Weighting w);

// The objectives (docs/LOSSES.md), each with its weight, summed. p_s and
// p_t are the student's and the teacher's distributions at temperature T.
struct LossConfig {
  double ce_weight = 1.0;          // CE against the hard label (T = 1)
  double kl_weight = 0.0;          // forward KL(p_t || p_s)
  double temperature = 1.0;        // T > 0, on both sides of every distillation term, no T^2
  double gamma = 0.0;              // decay exp(-(k-1)/gamma); 0 = no decay (weighting "decay" only)
  int64_t chunk_size = 0;          // loss chunk (positions); 0 = whole Q
  double reverse_kl_weight = 0.0;  // reverse KL(p_s || p_t)
  double jsd_weight = 0.0;         // generalized JSD with jsd_beta (TRL's convention)
  double jsd_beta = 0.5;           // mixture m = beta p_t + (1-beta) p_s; 0: forward KL, 1: reverse
  double tv_weight = 0.0;          // total variation 1/2 sum |p_s - p_t|
  Weighting weighting = Weighting::kDecay;
  double dpace_alpha = 0.5;  // D-PACE smoothing (1-alpha) q + alpha, in (0, 1]

  // Any objective that needs the teacher's distribution.
  bool uses_teacher() const {
    return kl_weight != 0 || reverse_kl_weight != 0 || jsd_weight != 0 || tv_weight != 0;
  }
  // Objectives that need the student's probabilities beside the teacher's
  // (reverse KL, TV, JSD at beta > 0); forward KL and CE do not.
  bool uses_student_probs() const {
    return reverse_kl_weight != 0 || tv_weight != 0 || (jsd_weight != 0 && jsd_beta != 0);
  }
};

struct RunConfig {
  uint64_t seed = 0;
  DType dtype = DType::kFloat32;
  int64_t threads = 0;  // 0: OMP_NUM_THREADS, else the core count
};

// Which tricks the optimized step uses; each can be turned off to debug
// (the reference step ignores this section).
struct OptimizedConfig {
  bool chunked_loss = true;           // fused chunked LM-head loss (chunk = loss.chunk_size)
  bool sparse_attention = true;       // tiled block-sparse attention, else dense
  bool checkpoint_layers = false;     // recompute each drafter layer in backward
  int64_t attention_tile = 256;       // key tile of the sparse attention
  int64_t target_query_chunk = 1024;  // target forward: query rows per chunk; 0 = dense
  // Which implementation of the fused loss and the sparse attention runs:
  // "host" (row kernels in plain C++, CPU tensors only), "aten" (ATen ops
  // only: the same code on CPU and CUDA), "auto" (host on CPU, aten
  // elsewhere). See resolve_kernels (optimized/kernels.h).
  std::string kernels = "auto";
};

// Which ranks run the target and which train drafters (SPEC.md's 8-GPU split).
// world_size 1 means one process doing both.
struct TopologyConfig {
  int64_t world_size = 1;
  std::vector<int64_t> target_ranks{0};
  std::vector<int64_t> drafter_ranks{0};
  std::string device = "cpu";            // "cpu" | "cuda" | "cuda:N"
  std::vector<double> device_memory_gb;  // per rank (decimal GB); empty = unknown
  double memory_reserve_gb = 2.0;        // kept free on every device (allocator, CUDA context)
  double timeout_s = 60.0;               // a transfer or collective waiting longer fails the run
  double startup_timeout_s = 600.0;      // rendezvous: covers loading the target and data
  int64_t queue_depth = 2;               // micro-batches a target rank may run ahead
};

struct Config {
  std::string path;  // where it was read from, for error messages
  TargetConfig target;
  DrafterConfig drafter;
  DataConfig data;
  LossConfig loss;
  RunConfig run;
  OptimizedConfig optimized;
  TopologyConfig topology;
  TrainConfig train;

  int64_t num_taps() const { return int64_t(drafter.target_layer_ids.size()); }
};

// "cpu", "cuda" or "cuda:N" (N < 1024): the devices a config or a command
// line may name.
bool is_device_name(const std::string& name);

// Parse and validate. `label` names the source in messages (a path, or e.g.
// "step.safetensors:__metadata__.config").
Config load_config(const std::string& path);
// The file with command-line overrides (`dflash train --set KEY=VALUE`):
// each KEY is a dotted TOML key (loss.jsd_weight), each VALUE a TOML value
// (0.5, true, "dpace"; a bare word is taken as a string). They replace or
// add keys before parsing, so an override meets the same checks as the file
// (unknown keys, types, ranges), and messages name the file and the override.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
Config parse_config_toml(const std::string& text, const std::string& label);
Config parse_config_json(const nlohmann::json& j, const std::string& label);

// Cross-field validation (called by the parsers; exposed for tests and for
// configs built in code).
void validate_config(const Config& c);

// The documented range of a number (docs/CONFIG.md's table). Checked
// before anything sizes memory by a value.
struct ConfigRange {
  const char* key;  // "target.vocab_size"
  double lo, hi;
  bool integer;
  bool lo_open, hi_open;
  bool contains(double v) const;
  bool contains_int(int64_t v) const;
  std::string text() const;  // "[2, 16777216]", "(0, 10]"
};

// One row per key of the config file (core/config_fields.cpp): the single
// statement of where it lives in Config, whether the file must give it, its
// range and its documentation. Parsing, the range checks of
// validate_config, config_to_json and docs/CONFIG.md's key table (printed
// by config_fields_markdown; core.Config.DocsTableIsTheFieldTable holds the
// two equal) all read it. An optional key's default is its member's
// initialiser above (a default-constructed Config), stated nowhere else.
struct ConfigField {
  enum class Type { kInt, kReal, kBool, kString, kInts, kReals, kRows, kSeed, kDType, kWeighting };
  enum class Need {
    kOptional,  // absent: the member's default
    kRequired,  // the file gives it (or, `from_hf`, an hf target's config.json)
    kTargets,   // [drafter] shape: absent, the target's value
    kRule,      // absent: computed (drafter.target_layer_ids, SPEC.md's tap rule)
    kWithHf,    // required with target.source = "hf", else optional (target.path)
    kHfOnly,    // not a key of the file: read from an hf target's config.json
  };
  const char* key;  // "loss.kl_weight"
  Type type;
  void* (*member)(Config&);  // the member it fills
  Need need;
  bool from_hf;     // an hf target's config.json fills it; the file may repeat it, equal
  bool omit_empty;  // left out of config_to_json when equal to its default
  std::optional<ConfigRange> range;  // numbers: checked by validate_config
  const char* doc;                   // docs/CONFIG.md's line
  const void* in(const Config& c) const;
};
const std::vector<ConfigField>& config_fields();
const ConfigField& config_field(const std::string& key);  // logic_error if none
// The field's value in `c` as JSON (enums by name).
nlohmann::json field_json(const ConfigField& f, const Config& c);
// docs/CONFIG.md's key table.
std::string config_fields_markdown();

const std::vector<ConfigRange>& config_ranges();
const ConfigRange& config_range(const std::string& key);  // logic_error if none

// The fully resolved config, SPEC.md names, sections as in the TOML.
nlohmann::json config_to_json(const Config& c);
std::string config_to_toml(const Config& c);

// The target fields of a Hugging Face model directory's config.json
// (core/hf_config.cpp): Qwen3ForCausalLM and LlamaForCausalLM in full, any
// other architecture's sizes (from text_config when it has one) for a target
// transformers runs; errors name the file and key.
TargetConfig read_hf_config(const std::string& model_dir);
// The same from config.json's text; `file` names it in messages.
TargetConfig parse_hf_config(const std::string& text, const std::string& file);

// Whether dflash's own target forward runs this target.architecture.
bool native_architecture(const std::string& architecture);

// SPEC.md default tap rule: L = Nd ids spread evenly over [1, Nt-3], rounded
// half to even like Python's round(); a single tap is layer Nt div 2.
std::vector<int64_t> default_target_layer_ids(int64_t num_target_layers, int64_t num_draft_layers);

// What is wrong with tapped target layer ids, as "expected X, found Y" text,
// or "" when nothing is (docs/SERVING.md): ids in [0, Nt), distinct and
// ascending (vLLM and SGLang append the tapped states in layer order, so any
// other order scrambles fc's inputs), and not the last layer Nt-1 unless
// `allow_last` (SGLang captures a layer's state at the next layer's input and
// cannot capture the last; speculators' converter drops that id).
std::string tap_rule_violation(const std::vector<int64_t>& ids, int64_t num_target_layers,
                               bool allow_last);

}  // namespace dflash
