// `dflash eval`; see eval.h.
#include "decode/eval.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "data/data.h"
#include "decode/served_eval.h"
#include "models/checkpoint.h"
#include "models/hf.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::decode {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void refuse(const std::string& file, const std::string& field,
                         const std::string& why) {
  throw std::runtime_error(fmt::format("{}: {}: {}; not evaluating", file, field, why));
}

}  // namespace

int64_t int_field(const nlohmann::json& j, const std::string& file, const std::string& key,
                  const std::string& prefix) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw std::runtime_error(fmt::format("{}: {}{}: expected an integer, found {}", file, prefix,
                                         key, j.contains(key) ? j[key].dump() : "nothing"));
  return j[key].get<int64_t>();
}

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "trainer_state.json")) return path;
  if (const auto latest = models::latest_checkpoint(path)) return *latest;
  throw std::runtime_error(fmt::format(
      "{}: neither a checkpoint (no trainer_state.json) nor a run directory with checkpoints",
      path));
}

namespace {

std::vector<int64_t> ids_of_json(const nlohmann::json& ids, const std::string& where, int64_t V,
                                 const std::string& key = "ids") {
  if (!ids.is_array() || ids.empty())
    throw std::runtime_error(where + ": " + key + ": expected a non-empty array");
  std::vector<int64_t> out;
  for (const auto& t : ids) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
      throw std::runtime_error(
          fmt::format("{}: {}: {} is not a token id in [0, {})", where, key, t.dump(), V));
    out.push_back(t.get<int64_t>());
  }
  return out;
}

// A path the run's config recorded, as this process can open it. A relative
// one was relative to the directory the run started in: trainer_state.json's
// `cwd`. Checkpoints without it (older runs), or a tree moved since: the
// current directory, then each ancestor of the checkpoint directory; the
// first that holds the path wins (none: as recorded, named in the error).
std::string recorded_path(const std::string& p, const models::Checkpoint& ck) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  std::vector<fs::path> bases;
  if (!ck.cwd.empty()) bases.push_back(ck.cwd);
  bases.push_back(fs::current_path());
  for (fs::path d = fs::absolute(ck.dir); d.has_relative_path(); d = d.parent_path())
    bases.push_back(d);
  for (const fs::path& b : bases)
    if (fs::exists(b / p)) return (b / p).lexically_normal().string();
  return ck.cwd.empty() ? p : (fs::path(ck.cwd) / p).string();
}

void resolve_recorded_paths(nlohmann::json& resolved, const models::Checkpoint& ck) {
  for (const auto& [section, key] : {std::pair<const char*, const char*>{"target", "path"},
                                     {"data", "path"},
                                     {"data", "eval_path"}}) {
    nlohmann::json& sec = resolved[section];
    if (sec.is_object() && sec.contains(key) && sec[key].is_string())
      sec[key] = recorded_path(sec[key].get<std::string>(), ck);
  }
}

// The run's config as the checkpoint recorded it, with the drafter's own
// config.json fields and, with --target, the given Hugging Face target.
Config eval_config(const models::Checkpoint& ck, const EvalOptions& o) {
  nlohmann::json resolved = recorded_config(ck, o.target);
  const std::string drafter_file = (fs::path(ck.dir) / "config.json").string();
  const nlohmann::json dj =
      nlohmann::json::parse(read_whole_file(drafter_file, "the drafter config"), nullptr, false);
  if (!dj.is_object()) refuse(drafter_file, "(root)", "not a JSON object");
  TargetConfig t;
  std::string target_dir;
  if (resolved["target"].value("source", "fixture") == "hf") {
    target_dir = resolved["target"].value("path", "");
    t = read_hf_config(target_dir);
  } else {
    t = parse_config_json(resolved, ck.dir + "/trainer_state.json").target;
  }
  check_drafter_config(dj, drafter_file, t, target_dir, o.block_size);
  const nlohmann::json& df = dj["dflash_config"];
  resolved["drafter"]["target_layer_ids"] = df["target_layer_ids"];
  resolved["data"]["mask_token_id"] = df["mask_token_id"];
  resolved["data"]["block_size"] = dj["block_size"];
  return parse_config_json(resolved, ck.dir + "/trainer_state.json");
}

}  // namespace

nlohmann::json recorded_config(const models::Checkpoint& ck, const std::string& target) {
  nlohmann::json resolved = ck.config;
  resolved.erase("__optimizer_steps");
  resolve_recorded_paths(resolved, ck);
  if (!target.empty()) resolved["target"] = {{"source", "hf"}, {"path", target}};
  resolved["data"]["num_samples"] = 1;  // self_distill: only its held-out stream is used
  return resolved;
}

void check_drafter_config(const nlohmann::json& d, const std::string& file, const TargetConfig& t,
                          const std::string& target_dir, int64_t block_size) {
  auto same = [&](const char* key, int64_t there, int64_t target) {
    if (there != target)
      refuse(file, key,
             fmt::format("{} disagrees with the target{} ({})", there,
                         target_dir.empty() ? "" : " " + target_dir, target));
  };
  same("hidden_size", int_field(d, file, "hidden_size"), t.shape.hidden_size);
  same("vocab_size", int_field(d, file, "vocab_size"), t.vocab_size);
  if (d.contains("num_target_layers"))
    same("num_target_layers", int_field(d, file, "num_target_layers"), t.num_hidden_layers);
  if (!d.contains("dflash_config") || !d["dflash_config"].is_object())
    refuse(file, "dflash_config", "missing (mask_token_id, target_layer_ids)");
  const nlohmann::json& df = d["dflash_config"];
  const int64_t mask = int_field(df, file, "mask_token_id", "dflash_config.");
  if (mask < 0 || mask >= t.vocab_size)
    refuse(file, "dflash_config.mask_token_id",
           fmt::format("{} is outside the target's vocabulary [0, {})", mask, t.vocab_size));
  if (!target_dir.empty() && has_byte_tokenizer(target_dir) && mask != ByteTokenizer::kMask)
    refuse(file, "dflash_config.mask_token_id",
           fmt::format("{} disagrees with the target's byte tokenizer ({}/{}: mask {})", mask,
                       target_dir, kByteTokenizerFile, ByteTokenizer::kMask));
  if (!df.contains("target_layer_ids") || !df["target_layer_ids"].is_array() ||
      df["target_layer_ids"].empty())
    refuse(file, "dflash_config.target_layer_ids", "expected a non-empty list of layer ids");
  std::vector<int64_t> ids;
  for (const auto& id : df["target_layer_ids"]) {
    if (!id.is_number_integer())
      refuse(file, "dflash_config.target_layer_ids", id.dump() + " is not a layer id");
    ids.push_back(id.get<int64_t>());
  }
  // dflash's own decoding can tap the last layer (a run that opted in); servers cannot.
  const std::string taps = tap_rule_violation(ids, t.num_hidden_layers, true);
  if (!taps.empty()) refuse(file, "dflash_config.target_layer_ids", taps);
  const int64_t trained = int_field(d, file, "block_size");
  if (trained < 2) refuse(file, "block_size", fmt::format("{} < 2", trained));
  if (block_size > trained)
    refuse(file, "block_size",
           fmt::format("the drafter was trained with blocks of {}; --block-size {} would put "
                       "mask slots at offsets it never saw",
                       trained, block_size));
}

std::vector<std::vector<int64_t>> read_prompt_file(const std::string& path, bool byte_text,
                                                   int64_t V, std::vector<std::string>* where_out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open the prompt file");
  const bool jsonl = fs::path(path).extension() == ".jsonl";
  std::vector<std::vector<int64_t>> out;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    const std::string where = fmt::format("{}:{}", path, ++n);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string text = line;
    if (jsonl) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) throw std::runtime_error(where + ": not a JSON object");
      if (j.contains("ids") || j.contains("input_ids")) {  // input_ids: as training data names them
        const char* key = j.contains("ids") ? "ids" : "input_ids";
        out.push_back(ids_of_json(j[key], where, V, key));
        if (where_out) where_out->push_back(where);
        continue;
      }
      if (!j.contains("text") || !j["text"].is_string())
        throw std::runtime_error(where +
                                 ": expected {\"text\": string} or {\"input_ids\": [...]} "
                                 "(or \"ids\")");
      text = j["text"].get<std::string>();
    }
    if (!byte_text)
      throw std::runtime_error(
          where +
          ": a text prompt needs a byte-tokenized target (byte_tokenizer.json); "
          "give token ids as {\"ids\": [...]} in a .jsonl file");
    if (const int64_t bad = first_invalid_utf8(text); bad >= 0)
      throw std::runtime_error(fmt::format("{}: invalid UTF-8 at byte {}", where, bad));
    out.push_back(ByteTokenizer::encode(text));
    if (where_out) where_out->push_back(where);
  }
  if (out.empty()) throw std::runtime_error(path + ": no prompts");
  return out;
}

int run_eval(const EvalOptions& o) {
  configure_threads(o.threads);
  const std::string dir = resolve_checkpoint(o.checkpoint);
  const models::Checkpoint ck = models::read_checkpoint(dir);
  const Config c = eval_config(ck, o);
  const TargetWeights target = models::load_target(c);
  const DrafterWeights drafter =
      bind_drafter(c, ck.params, master_type(c.run.dtype), dir + "/model.safetensors");
  const bool byte_text =
      c.data.byte_text() || (c.target.source == "hf" && has_byte_tokenizer(c.target.path));
  std::vector<std::vector<int64_t>> prompts;
  if (!o.prompts.empty()) {
    std::vector<std::string> where;
    prompts = read_prompt_file(o.prompts, byte_text, c.target.vocab_size, &where);
    // Checked here so that a refusal names the file and line.
    const DecodeOptions d{o.block_size > 0 ? o.block_size : c.data.block_size, o.max_new_tokens,
                          o.max_context > 0 ? o.max_context : context_limit(c)};
    for (size_t i = 0; i < prompts.size(); ++i) check_decode_inputs(c, prompts[i], d, where[i]);
  } else {
    const data::DataSplit data = data::load_data(c, &target);
    prompts = served_prompts(c, data.eval, o.num_prompts);
  }
  ServedOptions so;
  so.block_size = o.block_size > 0 ? o.block_size : c.data.block_size;
  so.max_new_tokens = o.max_new_tokens;
  so.max_context = o.max_context > 0 ? o.max_context : context_limit(c);
  so.budgets = o.budgets;
  const ServedModels m{
      &c, &target, &drafter,
      o.build == "reference" ? StepFn(reference::drafter_step) : StepFn(optimized::drafter_step)};
  fmt::print("eval: {} (step {}), target {}, {} prompts, {} new tokens each, context limit {}\n",
             dir, ck.state.step, c.target.source == "hf" ? c.target.path : "fixture",
             prompts.size(), o.max_new_tokens, so.max_context);
  const ServedReport rep = served_eval(m, prompts, so);
  fmt::print("{}", rep.text());
  if (!o.json.empty()) {
    nlohmann::json j = rep.to_json();
    j["checkpoint"] = dir, j["step"] = ck.state.step;
    safetensors::write_file_atomic(o.json, j.dump(2) + "\n");
  }
  return rep.mismatches() == 0 ? 0 : 1;
}

}  // namespace dflash::decode
