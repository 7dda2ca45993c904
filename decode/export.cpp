// `dflash export` and `--init-from`; see export.h and docs/SERVING.md.
#include "decode/export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <limits>

#include "core/files.h"
#include "core/init.h"
#include "core/safetensors.h"
#include "decode/eval.h"
#include "models/checkpoint.h"
#include "models/hf.h"

namespace dflash::decode {
namespace fs = std::filesystem;
namespace {

constexpr const char* kSpeculatorsVersion = "0.9.0";  // the version whose loader the tests run

[[noreturn]] void bad(const std::string& file, const std::string& field, const std::string& why) {
  throw std::runtime_error(fmt::format("{}: {}: {}", file, field, why));
}

at::ScalarType export_dtype(const std::string& d) {
  if (d == "bfloat16") return at::kBFloat16;
  if (d == "float32") return at::kFloat;
  throw std::runtime_error("--dtype: expected bfloat16 or float32, found " + d);
}

// The drafter's layers are all full attention: the engines keep them
// non-causal (bidirectional within a block), as they were trained.
void full_attention(nlohmann::json& j, const Config& c) {
  j["layer_types"] =
      std::vector<std::string>(size_t(c.drafter.num_hidden_layers), "full_attention");
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
}

// A tensor of a drafter directory, read as the file stores it.
std::map<std::string, at::Tensor> read_weights(const fs::path& dir) {
  const fs::path file = dir / "model.safetensors";
  if (!fs::exists(file))
    throw std::runtime_error(
        fmt::format("{}: missing (a drafter directory holds its weights in one model.safetensors)",
                    file.string()));
  std::map<std::string, at::Tensor> out;
  for (auto& [n, t] : safetensors::read(file.string()).tensors) out[n] = t;
  return out;
}

std::vector<int64_t> ids_at(const nlohmann::json& j, const std::string& file,
                            const std::string& key) {
  if (!j.is_array() || j.empty()) bad(file, key, "expected a non-empty list of layer ids");
  std::vector<int64_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer()) bad(file, key, v.dump() + " is not a layer id");
    ids.push_back(v.get<int64_t>());
  }
  // The order rule here; the range is the config's to check (drafter_mismatches).
  const std::string why = tap_rule_violation(ids, std::numeric_limits<int64_t>::max(), true);
  if (!why.empty()) bad(file, key, why);
  return ids;
}

// The Qwen3 shape fields of a config.json object (`prefix` names it).
void read_shape(const nlohmann::json& q, const std::string& file, const std::string& prefix,
                DrafterDir& d) {
  d.num_hidden_layers = int_field(q, file, "num_hidden_layers", prefix);
  d.vocab_size = int_field(q, file, "vocab_size", prefix);
  d.shape.hidden_size = int_field(q, file, "hidden_size", prefix);
  d.shape.intermediate_size = int_field(q, file, "intermediate_size", prefix);
  d.shape.num_attention_heads = int_field(q, file, "num_attention_heads", prefix);
  d.shape.num_key_value_heads = int_field(q, file, "num_key_value_heads", prefix);
  d.shape.head_dim = q.contains("head_dim") ? int_field(q, file, "head_dim", prefix)
                                            : d.shape.hidden_size / d.shape.num_attention_heads;
  if (q.contains("layer_types"))
    for (const auto& t : q["layer_types"])
      if (t != "full_attention")
        bad(file, prefix + "layer_types",
            fmt::format("{}: dflash trains full (bidirectional) attention layers only", t.dump()));
}

void write_export(const fs::path& out, const nlohmann::json& cfg,
                  const safetensors::NamedTensors& t, const nlohmann::json& provenance) {
  if (fs::exists(out))
    throw std::runtime_error(fmt::format(
        "{}: already exists; export writes a new directory (remove it first)", out.string()));
  const fs::path tmp =
      out.parent_path() / fmt::format(".tmp-{}-{}", out.filename().string(), ::getpid());
  try {
    fs::create_directories(tmp);
    safetensors::write((tmp / "model.safetensors").string(), t, {{"format", "pt"}});
    safetensors::write_file_atomic((tmp / "config.json").string(), cfg.dump(2) + "\n");
    safetensors::write_file_atomic((tmp / "dflash_export.json").string(),
                                   provenance.dump(2) + "\n");
    fs::rename(tmp, out);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw std::runtime_error(
        fmt::format("{}: export failed: {}; nothing was left behind", out.string(), e.what()));
  }
  safetensors::fsync_path(fs::absolute(out).parent_path().string());
}

}  // namespace

nlohmann::json zlab_config_json(const Config& c, const std::string& dtype) {
  nlohmann::json j = models::drafter_config_json(c);  // a checkpoint's config.json, plus:
  full_attention(j, c);
  j["torch_dtype"] = dtype;
  j["dflash_config"]["block_size"] = c.data.block_size;  // SGLang reads this one first
  return j;
}

nlohmann::json speculators_config_json(const Config& c, const std::string& dtype,
                                       const std::string& verifier_path,
                                       const nlohmann::json& verifier_architectures) {
  std::vector<int64_t> aux;  // Hugging Face hidden_states indices: layer i's output is i + 1
  for (int64_t id : c.drafter.target_layer_ids) aux.push_back(id + 1);
  nlohmann::json layer = models::qwen3_fields(c.drafter.shape, c.target.vocab_size,
                                              c.drafter.num_hidden_layers, false, dtype);
  layer.erase("torch_dtype");
  full_attention(layer, c);
  return {{"architectures", {"DFlashSpeculator"}},
          {"speculators_model_type", "dflash"},
          {"speculators_version", kSpeculatorsVersion},
          {"transformer_layer_config", layer},
          {"aux_hidden_state_layer_ids", aux},
          {"block_size", c.data.block_size},
          {"mask_token_id", c.data.mask_token_id},
          {"draft_vocab_size", c.target.vocab_size},
          {"target_hidden_size", c.target.shape.hidden_size},
          {"sample_from_anchor", false},
          // vLLM sets every layer causal when this is false (speculators'
          // default); the drafter was trained bidirectional within a block.
          {"sliding_window_non_causal", true},
          {"torch_dtype", dtype},
          {"speculators_config",
           {{"algorithm", "dflash"},
            {"default_proposal_method", "greedy"},
            {"proposal_methods",
             {{{"proposal_type", "greedy"},
               {"speculative_tokens", c.data.block_size - 1},
               {"accept_tolerance", 0.0},
               {"verifier_accept_k", 1}}}},
            {"verifier",
             {{"name_or_path", verifier_path}, {"architectures", verifier_architectures}}}}}};
}

int run_export(const ExportOptions& o) {
  const at::ScalarType dt = export_dtype(o.dtype);
  if (o.format != "zlab" && o.format != "speculators")
    throw std::runtime_error("--format: expected zlab or speculators, found " + o.format);
  const models::Checkpoint ck = models::read_checkpoint(resolve_checkpoint(o.source));
  const nlohmann::json resolved = recorded_config(ck, o.verifier);
  const Config c = parse_config_json(resolved, ck.dir + "/trainer_state.json");
  const std::string taps =
      tap_rule_violation(c.drafter.target_layer_ids, c.target.num_hidden_layers, false);
  if (!taps.empty())
    throw std::runtime_error(fmt::format(
        "{}/trainer_state.json: drafter.target_layer_ids: {}; not exporting a drafter no "
        "server can feed",
        ck.dir, taps));
  DrafterWeights w = make_drafter(c);  // the expected names and shapes
  DrafterDir mine;
  mine.dir = ck.dir, mine.params = ck.params;
  init_from_drafter(mine, c, w);  // every tensor present and shaped as the config says
  safetensors::NamedTensors t;
  for (auto& [n, p] : named(w)) t.emplace_back(n, p.detach().to(dt).contiguous());
  nlohmann::json cfg;
  if (o.format == "zlab") {
    cfg = zlab_config_json(c, o.dtype);
  } else {
    if (c.target.source != "hf")
      throw std::runtime_error(
          fmt::format("{}: the run's target is a seeded fixture, not a Hugging Face directory: the "
                      "speculators layout names its verifier; pass --verifier TARGET_DIR",
                      ck.dir));
    const fs::path vdir = fs::absolute(c.target.path).lexically_normal();
    const nlohmann::json vj =
        parse_json(read_whole_file((vdir / "config.json").string(), "the verifier config"),
                   (vdir / "config.json").string());
    cfg = speculators_config_json(c, o.dtype, vdir.string(),
                                  vj.value("architectures", nlohmann::json::array()));
  }
  const nlohmann::json provenance = {{"format", o.format},
                                     {"dtype", o.dtype},
                                     {"checkpoint", fs::absolute(ck.dir).string()},
                                     {"step", ck.state.step},
                                     {"written_by", "dflash export"}};
  write_export(fs::path(o.out), cfg, t, provenance);
  fmt::print("exported {} (step {}) as {} ({}) to {}\n", ck.dir, ck.state.step, o.format, o.dtype,
             o.out);
  return 0;
}

DrafterDir read_drafter_dir(const std::string& dir) {
  DrafterDir d;
  d.dir = dir;
  const std::string file = (fs::path(dir) / "config.json").string();
  const nlohmann::json j = parse_json(read_whole_file(file, "the drafter config"), file);
  if (!j.is_object()) bad(file, "(root)", "not a JSON object");
  if (j.contains("speculators_model_type")) {
    d.layout = "speculators";
    if (j["speculators_model_type"] != "dflash")
      bad(file, "speculators_model_type",
          "expected \"dflash\", found " + j["speculators_model_type"].dump());
    if (!j.contains("transformer_layer_config") || !j["transformer_layer_config"].is_object())
      bad(file, "transformer_layer_config", "missing (the draft layers' Qwen3 fields)");
    read_shape(j["transformer_layer_config"], file, "transformer_layer_config.", d);
    for (int64_t a : ids_at(j.value("aux_hidden_state_layer_ids", nlohmann::json()), file,
                            "aux_hidden_state_layer_ids")) {
      if (a < 1)
        bad(file, "aux_hidden_state_layer_ids",
            fmt::format("{} is the embedding's output, not a layer's (ids are layer + 1)", a));
      d.target_layer_ids.push_back(a - 1);
    }
    d.mask_token_id = int_field(j, file, "mask_token_id");
    d.block_size = int_field(j, file, "block_size");
  } else {
    d.layout = fs::exists(fs::path(dir) / "trainer_state.json") ? "dflash checkpoint" : "zlab";
    if (!j.contains("dflash_config") || !j["dflash_config"].is_object())
      bad(file, "dflash_config",
          "missing: neither the DFlash layout (dflash_config) nor the speculators layout "
          "(speculators_model_type)");
    read_shape(j, file, "", d);
    const nlohmann::json& df = j["dflash_config"];
    d.target_layer_ids = ids_at(df.value("target_layer_ids", nlohmann::json()), file,
                                "dflash_config.target_layer_ids");
    d.mask_token_id = int_field(df, file, "mask_token_id", "dflash_config.");
    d.block_size = df.contains("block_size") ? int_field(df, file, "block_size", "dflash_config.")
                                             : int_field(j, file, "block_size");
    if (j.contains("num_target_layers"))
      d.num_target_layers = int_field(j, file, "num_target_layers");
  }
  d.params = read_weights(dir);
  return d;
}

std::vector<std::string> drafter_mismatches(const DrafterDir& d, const Config& c) {
  std::vector<std::string> out;
  auto same = [&](const std::string& what, const std::string& there, const std::string& here) {
    if (there != here)
      out.push_back(fmt::format("{}: {} there, {} in the config", what, there, here));
  };
  auto num = [&](const std::string& what, int64_t there, int64_t here) {
    same(what, std::to_string(there), std::to_string(here));
  };
  if (!d.layout.empty()) {  // what the directory's config.json says
    same("target_layer_ids", fmt::format("[{}]", fmt::join(d.target_layer_ids, ", ")),
         fmt::format("[{}]", fmt::join(c.drafter.target_layer_ids, ", ")));
    num("mask_token_id", d.mask_token_id, c.data.mask_token_id);
    num("block_size", d.block_size, c.data.block_size);
    if (d.num_target_layers > 0)
      num("num_target_layers", d.num_target_layers, c.target.num_hidden_layers);
    num("vocab_size", d.vocab_size, c.target.vocab_size);
    num("num_hidden_layers", d.num_hidden_layers, c.drafter.num_hidden_layers);
    num("hidden_size", d.shape.hidden_size, c.drafter.shape.hidden_size);
    num("intermediate_size", d.shape.intermediate_size, c.drafter.shape.intermediate_size);
    num("num_attention_heads", d.shape.num_attention_heads, c.drafter.shape.num_attention_heads);
    num("num_key_value_heads", d.shape.num_key_value_heads, c.drafter.shape.num_key_value_heads);
    num("head_dim", d.shape.head_dim, c.drafter.shape.head_dim);
  }
  for (const ParamSpec& p : drafter_specs(c)) {  // the tensors, by name and shape
    const auto it = d.params.find(p.name);
    if (it == d.params.end())
      out.push_back(fmt::format("tensor {}: missing from model.safetensors", p.name));
    else if (it->second.sizes() != at::IntArrayRef(p.shape))
      out.push_back(fmt::format("tensor {}: shape {} there, {} in the config", p.name,
                                shape_text(it->second.sizes()), shape_text(p.shape)));
  }
  return out;
}

void init_from_drafter(const DrafterDir& d, const Config& c, DrafterWeights& w) {
  const std::vector<std::string> m = drafter_mismatches(d, c);
  if (!m.empty())
    throw std::runtime_error(fmt::format("{}: does not fit the config{} ({} mismatch{}):\n  {}",
                                         d.dir, c.path.empty() ? "" : " " + c.path, m.size(),
                                         m.size() == 1 ? "" : "es", fmt::join(m, "\n  ")));
  at::NoGradGuard no_grad;
  visit(w, [&](const std::string& n, at::Tensor& p) {
    p.copy_(d.params.at(n).to(p.device(), p.scalar_type()));
  });
}

}  // namespace dflash::decode
