// A Hugging Face config.json as a [target] section (read_hf_config,
// core/config.h). Qwen3ForCausalLM and LlamaForCausalLM are read in full
// (dflash runs them); for any other architecture only the sizes the drafter
// and the features need are read, from text_config when the model nests its
// language model there (Qwen3.5), and transformers runs the target.
// Both config.json generations are read: rope_theta / rope_scaling at the
// top (transformers 4.x) and rope_parameters (5.x).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/config.h"
#include "core/files.h"

namespace dflash {
namespace {

[[noreturn]] void hf_fail(const std::string& file, const std::string& key,
                          const std::string& expected, const nlohmann::json& found) {
  throw ConfigError(fmt::format("{}: {}: expected {}, found {}", file, key, expected,
                                found.is_null() ? std::string("nothing") : found.dump()));
}

// An integer of config.json held to the range of the TOML key it fills
// (target.<key>); JSON integers beyond int64 are refused, not used wrapped.
int64_t hf_int(const nlohmann::json& j, const std::string& file, const char* key,
               std::optional<int64_t> def = std::nullopt, const char* range_key = nullptr) {
  if (!j.contains(key) || j[key].is_null()) {
    if (def) return *def;
    hf_fail(file, key, "an integer (required)", nullptr);
  }
  const nlohmann::json& v = j[key];
  const ConfigRange& r = config_range(std::string("target.") + (range_key ? range_key : key));
  const std::string expected = fmt::format("an integer in {} (docs/CONFIG.md)", r.text());
  if (!v.is_number_integer()) hf_fail(file, key, expected, v);
  const int64_t x = v.get<int64_t>();  // beyond int64 wraps negative: out of every range
  if (!r.contains_int(x)) hf_fail(file, key, expected, v);
  return x;
}

double hf_number(const nlohmann::json& j, const std::string& file, const char* key, double def,
                 const char* range_key = nullptr) {
  if (!j.contains(key) || j[key].is_null()) return def;
  const ConfigRange& r = config_range(std::string("target.") + (range_key ? range_key : key));
  const std::string expected = fmt::format("a number in {} (docs/CONFIG.md)", r.text());
  if (!j[key].is_number()) hf_fail(file, key, expected, j[key]);
  const double x = j[key].get<double>();
  if (!r.contains(x)) hf_fail(file, key, expected, j[key]);
  return x;
}

struct Architecture {
  const char* cls;         // architectures[] entry
  const char* model_type;  // config.json's model_type, and target.architecture
};
constexpr Architecture kNative[] = {{"Qwen3ForCausalLM", "qwen3"}, {"LlamaForCausalLM", "llama"}};

// The model_type a config.json declares: a native architecture's, checked
// against architectures[]; any other model's own model_type.
std::string hf_architecture(const nlohmann::json& j, const std::string& file) {
  const nlohmann::json& a = j.contains("architectures") ? j["architectures"] : nlohmann::json();
  if (!a.is_array() || a.empty() || !a[0].is_string())
    hf_fail(file, "architectures",
            "a list naming the model class (Qwen3ForCausalLM and LlamaForCausalLM run natively)",
            a);
  for (const Architecture& n : kNative) {
    if (a[0] != n.cls) continue;
    if (j.contains("model_type") && j["model_type"] != n.model_type)
      hf_fail(file, "model_type",
              fmt::format("\"{}\" (architectures names {})", n.model_type, n.cls), j["model_type"]);
    return n.model_type;
  }
  const nlohmann::json& t = j.value("text_config", nlohmann::json::object());
  const nlohmann::json mt =
      t.contains("model_type") ? t["model_type"] : j.value("model_type", nlohmann::json());
  if (!mt.is_string() || mt.get<std::string>().empty())
    hf_fail(file, "model_type", "the model's type (a string)", mt);
  return mt.get<std::string>();
}

// The fields dflash's own forward cannot honour on a native architecture.
void hf_check_native(const nlohmann::json& j, const std::string& file, const std::string& arch) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    hf_fail(file, "hidden_act", "\"silu\" (SwiGLU)", j["hidden_act"]);
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && j[key] != false) hf_fail(file, key, "false (no biases)", j[key]);
  if (j.contains("use_sliding_window") && j["use_sliding_window"] != false)
    hf_fail(file, "use_sliding_window", "false (full causal attention)", j["use_sliding_window"]);
  if (arch == "llama" && j.contains("pretraining_tp") && j["pretraining_tp"] != 1)
    hf_fail(file, "pretraining_tp", "1", j["pretraining_tp"]);
}

// rope_parameters (transformers 5) or rope_scaling + rope_theta (4.x).
void hf_rope(const nlohmann::json& j, const std::string& file, bool native, LayerShape& s) {
  const char* key = j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const nlohmann::json r = j.value(key, nlohmann::json());
  if (!r.is_null() && !r.is_object()) hf_fail(file, key, "an object or null", r);
  s.rope_theta = hf_number(j, file, "rope_theta", 10000.0);  // the classes' default
  if (r.is_null()) return;
  const std::string where = std::string(key) + ".";
  if (r.contains("rope_theta")) {
    const double t = hf_number(r, file + ": " + key, "rope_theta", 0.0);
    if (j.contains("rope_theta") && !j["rope_theta"].is_null() &&
        j["rope_theta"] != r["rope_theta"])
      hf_fail(file, where + "rope_theta", fmt::format("rope_theta's {}", j["rope_theta"].dump()),
              r["rope_theta"]);
    s.rope_theta = t;
  }
  const nlohmann::json type =
      r.contains("rope_type") ? r["rope_type"] : r.value("type", nlohmann::json("default"));
  if (type == "default") return;
  if (type != "llama3") {
    if (native)
      hf_fail(file, where + "rope_type",
              "\"default\" or \"llama3\" (the RoPE dflash's forward computes)", type);
    return;  // transformers computes it
  }
  RopeScaling& k = s.rope_scaling;
  k.type = "llama3";
  k.factor = hf_number(r, file + ": " + key, "factor", k.factor, "rope_factor");
  k.low_freq_factor =
      hf_number(r, file + ": " + key, "low_freq_factor", k.low_freq_factor, "rope_low_freq_factor");
  k.high_freq_factor = hf_number(r, file + ": " + key, "high_freq_factor", k.high_freq_factor,
                                 "rope_high_freq_factor");
  k.original_max_position_embeddings =
      hf_int(r, file + ": " + key, "original_max_position_embeddings", std::nullopt,
             "rope_original_max_position_embeddings");
  if (!(k.high_freq_factor > k.low_freq_factor))
    hf_fail(file, where + "high_freq_factor",
            fmt::format("more than low_freq_factor {}", k.low_freq_factor), r["high_freq_factor"]);
}

}  // namespace

bool native_architecture(const std::string& a) {
  return std::any_of(std::begin(kNative), std::end(kNative),
                     [&](const Architecture& n) { return a == n.model_type; });
}

TargetConfig read_hf_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  TargetConfig c = parse_hf_config(
      read_whole_file<ConfigError>(file, fmt::format("(target.path = \"{}\")", dir)), file);
  c.path = dir;
  return c;
}

TargetConfig parse_hf_config(const std::string& text, const std::string& file) {
  const nlohmann::json root = parse_json<ConfigError>(text, file);
  if (!root.is_object()) hf_fail(file, "(root)", "a JSON object", root);
  TargetConfig c;
  c.source = "hf";
  c.architecture = hf_architecture(root, file);
  const bool native = native_architecture(c.architecture);
  // A multimodal model's language model keeps its sizes under text_config.
  const bool nested = !native && root.contains("text_config");
  if (nested && !root["text_config"].is_object())
    hf_fail(file, "text_config", "an object", root["text_config"]);
  const nlohmann::json& j = nested ? root["text_config"] : root;
  const std::string at = nested ? file + ": text_config" : file;
  if (native) hf_check_native(j, at, c.architecture);
  c.vocab_size = hf_int(j, at, "vocab_size");
  c.num_hidden_layers = hf_int(j, at, "num_hidden_layers");
  LayerShape& s = c.shape;
  s.hidden_size = hf_int(j, at, "hidden_size");
  s.num_attention_heads = hf_int(j, at, "num_attention_heads");
  s.num_key_value_heads = hf_int(j, at, "num_key_value_heads", s.num_attention_heads);
  // Qwen3Config's default head_dim is 128; LlamaConfig's hidden / heads.
  const bool by_heads = c.architecture == "llama" && s.hidden_size % s.num_attention_heads == 0;
  s.head_dim = hf_int(j, at, "head_dim", by_heads ? s.hidden_size / s.num_attention_heads : 128);
  s.intermediate_size = hf_int(j, at, "intermediate_size");
  s.rms_norm_eps = hf_number(j, at, "rms_norm_eps", 1e-6);
  s.qk_norm = c.architecture != "llama";
  hf_rope(j, at, native, s);
  const nlohmann::json& tie_from = root.contains("tie_word_embeddings") ? root : j;
  if (tie_from.contains("tie_word_embeddings") && !tie_from["tie_word_embeddings"].is_boolean())
    hf_fail(file, "tie_word_embeddings", "true or false", tie_from["tie_word_embeddings"]);
  c.tie_word_embeddings = tie_from.value("tie_word_embeddings", false);
  if (j.contains("max_position_embeddings") && !j["max_position_embeddings"].is_null())
    c.max_position_embeddings = hf_int(j, at, "max_position_embeddings");
  return c;
}

}  // namespace dflash
