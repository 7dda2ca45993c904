// Hugging Face Qwen3 directories: loading a target, writing one (tests, demos).
#include "models/hf.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/files.h"
#include "core/init.h"
#include "core/safetensors.h"
#include "core/step.h"

namespace dflash::models {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";

nlohmann::json read_json_file(const std::string& file) {
  return parse_json(read_whole_file(file), file);
}

// Tensor name -> shard file, from the index or the single file.
std::map<std::string, std::string> weight_files(const std::string& dir,
                                                const std::vector<ParamSpec>& specs, bool tied) {
  std::map<std::string, std::string> where;
  const fs::path index = fs::path(dir) / kIndexFile;
  if (!fs::exists(index)) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(single))
      throw std::runtime_error(
          fmt::format("{}: expected model.safetensors or {}, found neither", dir, kIndexFile));
    for (const ParamSpec& s : specs) where[s.name] = single.string();
    return where;
  }
  const nlohmann::json j = read_json_file(index.string());
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw std::runtime_error(
        fmt::format("{}: weight_map: expected an object {{tensor: file}}", index.string()));
  const nlohmann::json& map = j["weight_map"];
  for (const ParamSpec& s : specs) {
    if (!map.contains(s.name)) {
      if (tied && s.name == "lm_head.weight") continue;
      throw std::runtime_error(
          fmt::format("{}: weight_map: no entry for {}", index.string(), s.name));
    }
    if (!map[s.name].is_string())
      throw std::runtime_error(fmt::format("{}: weight_map.{}: expected a file name, found {}",
                                           index.string(), s.name, map[s.name].dump()));
    const fs::path shard = fs::path(dir) / map[s.name].get<std::string>();
    if (!fs::exists(shard))
      throw std::runtime_error(
          fmt::format("{}: weight_map: {} is in {}, which does not exist "
                      "(missing shard)",
                      index.string(), s.name, shard.string()));
    where[s.name] = shard.string();
  }
  return where;
}

}  // namespace

namespace {

// The named tensors of the model directory (all of `specs`), one shard file
// in memory at a time, each checked against its spec and converted.
std::map<std::string, at::Tensor> load_hf_tensors(const Config& c,
                                                  const std::vector<ParamSpec>& specs) {
  const std::string& dir = c.target.path;
  const bool tied = c.target.tie_word_embeddings;
  const std::map<std::string, std::string> where = weight_files(dir, specs, tied);
  std::map<std::string, std::vector<const ParamSpec*>> by_file;
  for (const ParamSpec& s : specs) {
    auto it = where.find(s.name);
    if (it != where.end()) by_file[it->second].push_back(&s);
  }
  const at::ScalarType dt = scalar_type(c.run.dtype);
  std::map<std::string, at::Tensor> taken;
  for (const auto& [file, wanted] : by_file) {
    const safetensors::File f = safetensors::read(file);
    for (const ParamSpec* s : wanted) {
      if (!f.has(s->name)) {
        if (tied && s->name == "lm_head.weight") continue;  // HF leaves the tied head out
        throw std::runtime_error(fmt::format("{}: missing tensor {}", f.label, s->name));
      }
      const at::Tensor& t = f.get(s->name);
      if (t.sizes().vec() != s->shape)
        throw std::runtime_error(
            fmt::format("{}: {}: expected shape {} (from {}/config.json), found {}", f.label,
                        s->name, shape_text(s->shape), dir, shape_text(t.sizes())));
      if (!t.is_floating_point())
        throw std::runtime_error(fmt::format("{}: {}: expected a floating dtype, found {}", f.label,
                                             s->name, at::toString(t.scalar_type())));
      taken[s->name] = t.to(dt).contiguous().clone();  // not a view of the file buffer
    }
  }
  for (const ParamSpec& s : specs)
    if (!taken.count(s.name) && !(tied && s.name == "lm_head.weight"))
      throw std::runtime_error(fmt::format("{}: missing tensor {}", dir, s.name));
  return taken;
}

}  // namespace

TargetWeights load_hf_target(const Config& c) {
  const std::map<std::string, at::Tensor> taken = load_hf_tensors(c, target_specs(c));
  TargetWeights w;
  w.qk_norm = c.target.shape.qk_norm;
  w.layers.resize(size_t(c.target.num_hidden_layers));
  visit(w, [&](const std::string& n, at::Tensor& t) {
    if (taken.count(n)) t = taken.at(n);
  });
  if (c.target.tie_word_embeddings) w.lm_head = w.embed_tokens;  // one tensor, as HF ties them
  return w;
}

FrozenWeights load_frozen(const Config& c) {
  if (c.target.source != "hf") return make_target(c).frozen();
  std::vector<ParamSpec> specs;
  for (const ParamSpec& s : target_specs(c))
    if (s.name == "model.embed_tokens.weight" || s.name == "lm_head.weight") specs.push_back(s);
  const std::map<std::string, at::Tensor> taken = load_hf_tensors(c, specs);
  const at::Tensor embed = taken.at("model.embed_tokens.weight");
  return {embed, c.target.tie_word_embeddings ? embed : taken.at("lm_head.weight")};
}

TargetWeights load_target(const Config& c) {
  if (!native_architecture(c.target.architecture))
    throw std::runtime_error(fmt::format(
        "{}: target.architecture = \"{}\": dflash's own forward runs qwen3 and llama only; "
        "compute this target's features with `dflash features` (transformers runs it) and "
        "train with data.source = \"features\" (docs/TRAINING.md)",
        c.path.empty() ? c.target.path : c.path, c.target.architecture));
  if (c.target.source == "hf") return load_hf_target(c);
  return make_target(c);
}

nlohmann::json qwen3_fields(const LayerShape& s, int64_t vocab_size, int64_t num_layers,
                            bool tie_word_embeddings, const std::string& torch_dtype) {
  return {{"model_type", "qwen3"},
          {"hidden_size", s.hidden_size},
          {"intermediate_size", s.intermediate_size},
          {"num_hidden_layers", num_layers},
          {"num_attention_heads", s.num_attention_heads},
          {"num_key_value_heads", s.num_key_value_heads},
          {"head_dim", s.head_dim},
          {"hidden_act", "silu"},
          {"rms_norm_eps", s.rms_norm_eps},
          {"rope_theta", s.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"max_position_embeddings", 40960},
          {"vocab_size", vocab_size},
          {"tie_word_embeddings", tie_word_embeddings},
          {"torch_dtype", torch_dtype},
          {"use_cache", true}};
}

void write_hf_model(const std::string& dir, const Config& c, const TargetWeights& w, int shards) {
  fs::create_directories(dir);
  nlohmann::json cfg = qwen3_fields(c.target.shape, c.target.vocab_size, c.target.num_hidden_layers,
                                    c.target.tie_word_embeddings, dtype_name(c.run.dtype));
  cfg["architectures"] = {"Qwen3ForCausalLM"};
  if (c.target.architecture == "llama") {  // the same keys, plus Llama's own
    cfg["architectures"] = {"LlamaForCausalLM"};
    cfg["model_type"] = "llama";
    cfg["mlp_bias"] = false;
    const RopeScaling& r = c.target.shape.rope_scaling;
    if (r.type == "llama3")
      cfg["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  safetensors::write_file_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2) + "\n");
  safetensors::NamedTensors all;
  TargetWeights copy = w;
  visit(copy, [&](const std::string& n, at::Tensor& t) {
    if (!(c.target.tie_word_embeddings && n == "lm_head.weight"))
      all.emplace_back(n, t.detach().contiguous());
  });
  if (shards <= 1) {
    safetensors::write((fs::path(dir) / "model.safetensors").string(), all, {{"format", "pt"}});
    return;
  }
  nlohmann::json map = nlohmann::json::object();
  for (int k = 0; k < shards; ++k) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards);
    safetensors::NamedTensors part;
    for (size_t i = size_t(k); i < all.size(); i += size_t(shards)) {
      part.push_back(all[i]);
      map[all[i].first] = file;
    }
    safetensors::write((fs::path(dir) / file).string(), part, {{"format", "pt"}});
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
  safetensors::write_file_atomic((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
}

}  // namespace dflash::models
