// `dflash features`: the target's tapped features and final hidden states,
// precomputed into safetensors shards so training need not load the target.
//
// DIR/features.json   {"format": "dflash-features-v1", vocab_size, hidden_size,
//                      seq_len, target_layer_ids, mask_token_id, dtype,
//                      target_identity (the target's config hash), engine
//                      ("dflash" or "transformers X.Y.Z"), config,
//                      "train": [{"file", "samples"}...], "eval": [...]}
// DIR/train-00000.safetensors ...  input_ids (n, S) int64, loss_mask (n, S) uint8,
//                                  features (n, S, L*H), target_hidden (n, S, H)
// DIR/frozen.safetensors          embed_tokens.weight, lm_head.weight
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/hash.h"
#include "core/safetensors.h"
#include "core/step.h"
#include "data/data.h"
#include "harness/memory_guard.h"
#include "models/hf.h"
#include "optimized/target.h"
#include "reference/target.h"

namespace dflash::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndex = "features.json";
constexpr const char* kFormat = "dflash-features-v1";

nlohmann::json read_index(const std::string& dir) {
  const std::string file = (fs::path(dir) / kIndex).string();
  std::ifstream in(file);
  if (!in)
    throw DataError(
        fmt::format("{}: cannot open (data.path should be a `dflash features` output "
                    "directory)",
                    file));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", file, e.what()));
  }
  if (!j.is_object() || j.value("format", "") != kFormat)
    throw DataError(fmt::format("{}: format: expected \"{}\"", file, kFormat));
  return j;
}

// Which target wrote a features directory: FNV-1a 64 of a Hugging Face
// target's config.json, or of a fixture target's section and seed.
std::string target_identity(const Config& c) {
  if (c.target.source == "hf") {
    const std::string file = (fs::path(c.target.path) / "config.json").string();
    return fmt::format("hf {} fnv1a64 {:016x}", c.target.path,
                       fnv1a64(read_whole_file<DataError>(file, "the target's config.json")));
  }
  return fmt::format("fixture seed {} fnv1a64 {:016x}", c.run.seed,
                     fnv1a64(config_to_json(c)["target"].dump()));
}

// The directory must have been written for this config's target and taps.
void check_index(const Config& c, const nlohmann::json& j, const std::string& dir) {
  const std::string file = (fs::path(dir) / kIndex).string();
  auto same = [&](const char* key, const nlohmann::json& want, const char* from) {
    if (!j.contains(key) || j[key] != want)
      throw DataError(fmt::format("{}: {}: expected {} ({} in {}), found {}", file, key,
                                  want.dump(), from, c.path,
                                  j.contains(key) ? j[key].dump() : "nothing"));
  };
  same("vocab_size", c.target.vocab_size, "target.vocab_size");
  same("hidden_size", c.target.shape.hidden_size, "target.hidden_size");
  same("seq_len", c.data.seq_len, "data.seq_len");
  same("target_layer_ids", c.drafter.target_layer_ids, "drafter.target_layer_ids");
  same("mask_token_id", c.data.mask_token_id, "data.mask_token_id");
  same("dtype", dtype_name(c.run.dtype), "run.dtype");
  // Another target with the same shapes (directories from before the
  // identity was recorded are read unchecked).
  if (j.contains("target_identity")) {
    const std::string here = target_identity(c), there = j.value("target_identity", "");
    // The path may differ (a moved tree): the hash is what identifies it.
    if (there.substr(there.rfind(' ') + 1) != here.substr(here.rfind(' ') + 1))
      throw DataError(fmt::format(
          "{}: target_identity: written by another target ({}), not the config's ({}: {})", file,
          there, c.path, here));
  }
}

at::Tensor shard_tensor(const safetensors::File& f, const char* name, std::vector<int64_t> shape) {
  const at::Tensor& t = f.get(name);
  if (t.sizes().vec() != shape)
    throw DataError(fmt::format("{}: {}: expected shape {}, found {}", f.label, name,
                                shape_text(shape), shape_text(t.sizes())));
  return t;
}

Dataset read_shard(const Config& c, const std::string& file, int64_t n) {
  const safetensors::File f = safetensors::read(file);
  const int64_t S = c.data.seq_len, H = c.target.shape.hidden_size, L = c.num_taps();
  const at::ScalarType dt = scalar_type(c.run.dtype);
  Dataset d{file, shard_tensor(f, "input_ids", {n, S}).to(at::kLong),
            shard_tensor(f, "loss_mask", {n, S}).to(at::kBool),
            shard_tensor(f, "features", {n, S, L * H}).to(dt),
            shard_tensor(f, "target_hidden", {n, S, H}).to(dt)};
  if (n > 0) {
    const int64_t lo = d.input_ids.min().item<int64_t>(), hi = d.input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= c.target.vocab_size ||
        (d.input_ids == c.data.mask_token_id).any().item<bool>())
      throw DataError(
          fmt::format("{}: input_ids: expected token ids in [0, {}) other than the mask "
                      "token {}, found [{}, {}]",
                      file, c.target.vocab_size, c.data.mask_token_id, lo, hi));
    const at::Tensor m = f.get("loss_mask");
    if (((m != 0) & (m != 1)).any().item<bool>())
      throw DataError(fmt::format("{}: loss_mask: expected 0 or 1 entries", file));
  }
  return d;
}

Dataset cat_datasets(const std::string& label, const std::vector<Dataset>& parts) {
  if (parts.empty()) return {label, {}, {}, {}, {}};
  std::vector<at::Tensor> a, b, f, h;
  for (const Dataset& p : parts)
    a.push_back(p.input_ids), b.push_back(p.loss_mask), f.push_back(p.features),
        h.push_back(p.target_hidden);
  return {label, at::cat(a), at::cat(b), at::cat(f), at::cat(h)};
}

// The target's outputs for samples [s0, s0+n) of a split.
using SplitForward =
    std::function<reference::TargetOutputs(int64_t s0, int64_t n, const at::Tensor& ids)>;

// Runs the target over `d` in chunks and writes shards; returns the index entries.
nlohmann::json write_split(const Dataset& d, const SplitForward& forward, const std::string& split,
                           const fs::path& dir, int64_t shard_samples) {
  nlohmann::json entries = nlohmann::json::array();
  at::NoGradGuard ng;
  for (int64_t s0 = 0, k = 0; s0 < d.size(); s0 += shard_samples, ++k) {
    const int64_t n = std::min(shard_samples, d.size() - s0);
    const at::Tensor ids = d.input_ids.narrow(0, s0, n).contiguous();
    const reference::TargetOutputs out = forward(s0, n, ids);
    const std::string name = fmt::format("{}-{:05d}.safetensors", split, k);
    safetensors::write((dir / name).string(),
                       {{"input_ids", ids},
                        {"loss_mask", d.loss_mask.narrow(0, s0, n).to(at::kByte).contiguous()},
                        {"features", out.features.contiguous()},
                        {"target_hidden", out.final_hidden.contiguous()}},
                       {{"format", kFormat}});
    entries.push_back({{"file", name}, {"samples", n}});
  }
  return entries;
}

// The transformers engine: the splits' ids to a file, python/dflash/
// hf_features.py over them, its outputs back (one process for all splits:
// loading the model dominates).
struct HfOutputs {
  std::map<std::string, at::Tensor> t;  // "<split>.features", ..., "lm_head.weight"
  std::string engine;                   // "transformers 5.x.y"
};

void run_python(const FeatureEngine& e, const std::vector<std::string>& args) {
  if (e.python.empty())
    throw DataError(
        "dflash features: the transformers engine needs the torch environment's python "
        "(ci/bootstrap.sh makes it; DFLASH_PYTHON names another)");
  std::vector<std::string> argv = {e.python, "-m", "dflash.hf_features"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cv;
  for (std::string& a : argv) cv.push_back(a.data());
  cv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw DataError(fmt::format("dflash features: cannot fork: {}", strerror(errno)));
  if (pid == 0) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = e.pythonpath + (old && *old ? std::string(":") + old : "");
    ::setenv("PYTHONPATH", path.c_str(), 1);
    ::execv(e.python.c_str(), cv.data());
    std::fprintf(stderr, "dflash features: cannot run %s: %s\n", e.python.c_str(),
                 std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw DataError(fmt::format(
        "dflash features: the transformers engine ({} -m dflash.hf_features) failed ({}); "
        "its message is above",
        e.python,
        WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status)) : std::string("killed")));
}

HfOutputs transformers_forward(const Config& c, const FeatureEngine& e, const DataSplit& data,
                               const fs::path& tmp) {
  safetensors::NamedTensors in;
  for (const auto* d : {&data.train, &data.eval})
    if (d->size() > 0)
      in.emplace_back(std::string(d == &data.train ? "train" : "eval") + ".input_ids",
                      d->input_ids.contiguous());
  const std::string in_file = (tmp / "engine-in.safetensors").string();
  const std::string out_file = (tmp / "engine-out.safetensors").string();
  safetensors::write(in_file, in, {{"format", kFormat}});
  run_python(e, {"--target", c.target.path, "--input", in_file, "--output", out_file, "--layers",
                 fmt::format("{}", fmt::join(c.drafter.target_layer_ids, ",")), "--dtype",
                 dtype_name(c.run.dtype)});
  const safetensors::File f = safetensors::read(out_file);
  const auto version = f.metadata.find("engine");
  HfOutputs o{{f.tensors.begin(), f.tensors.end()},
              version == f.metadata.end() ? "transformers" : version->second};
  fs::remove(in_file), fs::remove(out_file);
  return o;
}

// A split's outputs from the engine's file, shapes checked.
SplitForward from_engine(const Config& c, const HfOutputs& o, const std::string& split) {
  return [&c, &o, split](int64_t s0, int64_t n, const at::Tensor&) {
    auto get = [&](const std::string& key, int64_t width) {
      auto it = o.t.find(split + "." + key);
      const int64_t S = c.data.seq_len;
      if (it == o.t.end() || it->second.dim() != 3 || it->second.size(1) != S ||
          it->second.size(2) != width || it->second.size(0) < s0 + n)
        throw DataError(fmt::format(
            "dflash features: the transformers engine's {}.{}: expected shape [n, {}, {}], found "
            "{} (is target.hidden_size that of {}?)",
            split, key, S, width,
            it == o.t.end() ? std::string("nothing") : shape_text(it->second.sizes()),
            c.target.path));
      return it->second.narrow(0, s0, n).to(scalar_type(c.run.dtype));
    };
    const int64_t H = c.target.shape.hidden_size;
    return reference::TargetOutputs{get("features", c.num_taps() * H), get("target_hidden", H)};
  };
}

}  // namespace

Dataset read_features(const Config& c, const std::string& dir, const std::string& split) {
  const nlohmann::json j = read_index(dir);
  check_index(c, j, dir);
  std::vector<Dataset> parts;
  const nlohmann::json entries = j.value(split, nlohmann::json::array());
  if (!entries.is_array())
    throw DataError(fmt::format("{}/{}: {}: expected an array of shards", dir, kIndex, split));
  for (const auto& e : entries) {
    if (!e.is_object() || !e.value("file", nlohmann::json()).is_string() ||
        !e.value("samples", nlohmann::json()).is_number_integer())
      throw DataError(
          fmt::format("{}/{}: {}: expected entries {{\"file\": name, \"samples\": n}}, "
                      "found {}",
                      dir, kIndex, split, e.dump()));
    const fs::path p = fs::path(dir) / e.value("file", "");
    if (!fs::exists(p))
      throw DataError(fmt::format("{}/{}: {}: lists {}, which does not exist (missing shard)", dir,
                                  kIndex, split, p.string()));
    parts.push_back(read_shard(c, p.string(), e.value("samples", int64_t(0))));
  }
  if (split == "train" && parts.empty())
    throw DataError(fmt::format("{}/{}: train: expected at least one shard", dir, kIndex));
  return cat_datasets(fmt::format("{} ({})", dir, split), parts);
}

FrozenWeights read_features_frozen(const Config& c, const std::string& dir) {
  const std::string file = (fs::path(dir) / "frozen.safetensors").string();
  const safetensors::File f = safetensors::read(file);
  std::map<std::string, at::Tensor> m(f.tensors.begin(), f.tensors.end());
  return bind_frozen(c, m, scalar_type(c.run.dtype), file);
}

int write_features(const Config& c, const std::string& out_dir, int64_t shard_samples,
                   const FeatureEngine& engine) {
  const std::string& config = c.path;
  if (c.data.source == "fixture" || c.data.source == "inline" || c.data.source == "features")
    throw DataError(
        fmt::format("{}: data.source: expected jsonl, shards or self_distill for "
                    "`dflash features` (a finite dataset), found \"{}\"",
                    config, c.data.source));
  if (shard_samples < 1)
    throw DataError(fmt::format("--shard-samples: expected >= 1, found {}", shard_samples));
  const fs::path out = fs::path(out_dir).lexically_normal() / "";  // "a/b/" for "a/b" or "a/b/"
  const fs::path final_dir = out.parent_path();
  if (fs::exists(final_dir))
    throw DataError(fmt::format("{}: already exists; not overwriting it", final_dir.string()));
  const bool native = native_architecture(c.target.architecture);
  if (engine.name != "auto" && engine.name != "dflash" && engine.name != "transformers")
    throw DataError(
        fmt::format("--engine: expected auto, dflash or transformers, found \"{}\"", engine.name));
  const bool hf_engine = engine.name == "transformers" || (engine.name == "auto" && !native);
  if (hf_engine && c.target.source != "hf")
    throw DataError(
        fmt::format("{}: target.source: the transformers engine loads a Hugging Face directory "
                    "(target.source = \"hf\"), found \"{}\"",
                    config, c.target.source));
  if (hf_engine && c.data.source == "self_distill")
    throw DataError(fmt::format(
        "{}: data.source = \"self_distill\" generates with dflash's own target forward, which "
        "does not run target.architecture = \"{}\": give the data as jsonl, shards or text",
        config, c.target.architecture));
  if (!hf_engine) harness::guard_memory(c, harness::Workload::kFeatures, "dflash features");
  configure_threads(c.run.threads);
  // --engine dflash on another architecture: load_target names the way out.
  const TargetWeights target = hf_engine ? TargetWeights{} : models::load_target(c);
  const DataSplit data = load_data(c, hf_engine ? nullptr : &target);
  const fs::path tmp = final_dir.parent_path() /
                       fmt::format(".{}.tmp-{}", final_dir.filename().string(), ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    nlohmann::json j = {{"format", kFormat},
                        {"vocab_size", c.target.vocab_size},
                        {"hidden_size", c.target.shape.hidden_size},
                        {"seq_len", c.data.seq_len},
                        {"target_layer_ids", c.drafter.target_layer_ids},
                        {"mask_token_id", c.data.mask_token_id},
                        {"dtype", dtype_name(c.run.dtype)},
                        {"target_identity", target_identity(c)},
                        {"config", config_to_json(c)}};
    FrozenWeights frozen = target.frozen();
    HfOutputs hf;
    SplitForward train_fw, eval_fw;
    if (hf_engine) {
      hf = transformers_forward(c, engine, data, tmp);
      train_fw = from_engine(c, hf, "train"), eval_fw = from_engine(c, hf, "eval");
      frozen = bind_frozen(c, hf.t, scalar_type(c.run.dtype),
                           "dflash features: the transformers engine's output");
    } else {
      train_fw = eval_fw = [&](int64_t, int64_t, const at::Tensor& ids) {
        return optimized::target_forward(c, target, ids);
      };
    }
    j["engine"] = hf_engine ? hf.engine : "dflash";
    j["train"] = write_split(data.train, train_fw, "train", tmp, shard_samples);
    j["eval"] = write_split(data.eval, eval_fw, "eval", tmp, shard_samples);
    safetensors::write(
        (tmp / "frozen.safetensors").string(),
        {{"embed_tokens.weight", frozen.embed_tokens}, {"lm_head.weight", frozen.lm_head}},
        {{"format", kFormat}});
    safetensors::write_file_atomic((tmp / kIndex).string(), j.dump(2) + "\n");
    fs::rename(tmp, final_dir);
  } catch (...) {
    fs::remove_all(tmp);
    throw;
  }
  fmt::print("features: {} training and {} held-out samples in {}\n", data.train.size(),
             data.eval.size(), final_dir.string());
  return 0;
}

}  // namespace dflash::data
