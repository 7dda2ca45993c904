// Atomic run checkpoints and resume.
#include "models/checkpoint.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/files.h"
#include "core/safetensors.h"
#include "models/hf.h"

namespace dflash::models {
namespace fs = std::filesystem;
namespace {

std::string step_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// Test hook: DFLASH_TEST_CRASH_IN_CHECKPOINT=<step> dies half-way through
// writing that checkpoint (after the weights, before the rename).
void maybe_crash(int64_t step) {
  const char* s = std::getenv("DFLASH_TEST_CRASH_IN_CHECKPOINT");
  if (s && std::atoll(s) == step) {
    fmt::print(stderr, "test hook: dying while writing checkpoint {}\n", step);
    std::fflush(stderr);
    std::_Exit(9);
  }
}

// Test hook: DFLASH_TEST_FULL_DISK_IN_CHECKPOINT=<step> makes the disk
// "full" for the rest of that checkpoint's write: files may grow to 1 KiB
// (RLIMIT_FSIZE, SIGXFSZ ignored), so the optimizer state's write fails
// like a full disk's, through the real error path.
void maybe_fill_disk(int64_t step) {
  const char* s = std::getenv("DFLASH_TEST_FULL_DISK_IN_CHECKPOINT");
  if (!s || std::atoll(s) != step) return;
  std::signal(SIGXFSZ, SIG_IGN);
  const rlimit lim{1024, 1024};
  setrlimit(RLIMIT_FSIZE, &lim);
}

std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::is_directory(root)) return out;
  static const std::regex re("step-(\\d+)");
  for (const auto& e : fs::directory_iterator(root)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, re) &&
        fs::exists(e.path() / "trainer_state.json"))
      out.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void prune(const fs::path& root, int64_t keep) {
  auto all = complete_checkpoints(root);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i].second);
  for (const auto& e : fs::directory_iterator(root))  // leftovers of killed writes
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path());
}

// "section.key" -> value, for comparing resolved configs.
void flatten(const nlohmann::json& j, const std::string& prefix,
             std::map<std::string, nlohmann::json>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out[prefix] = j;
  }
}

bool cadence_key(const std::string& k) {
  static const std::set<std::string> kFree = {
      "train.log_every",          "train.eval_every",           "train.eval_batches",
      "train.checkpoint_every",   "train.keep_checkpoints",     "train.out_dir",
      "train.report_to",          "train.served_eval_every",    "train.served_eval_prompts",
      "train.served_eval_tokens", "train.served_tree_budget",   "run.threads",
      "optimized.kernels",        "topology.timeout_s",         "topology.startup_timeout_s",
      "topology.queue_depth",     "topology.memory_reserve_gb", "topology.device_memory_gb"};
  return kFree.count(k) > 0;
}

// Keys of the learning-rate schedule, which a resumed run may change: the
// rate at step t is a function of t and these alone (AdamW::lr_at), so the
// run continues from its recorded step on the new schedule.
bool schedule_key(const std::string& k) {
  static const std::set<std::string> kSchedule = {"train.steps", "train.lr", "train.warmup_steps",
                                                  "train.min_lr_ratio"};
  return kSchedule.count(k) > 0;
}

}  // namespace

nlohmann::json drafter_config_json(const Config& c) {
  nlohmann::json j =
      qwen3_fields(c.drafter.shape, c.target.vocab_size, c.drafter.num_hidden_layers, false,
                   dtype_name(c.run.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32));
  j["architectures"] = {"DFlashDraftModel"};
  j["block_size"] = c.data.block_size;
  j["num_target_layers"] = c.target.num_hidden_layers;
  j["dflash_config"] = {{"mask_token_id", c.data.mask_token_id},
                        {"target_layer_ids", c.drafter.target_layer_ids}};
  return j;
}

namespace {

// Every file of checkpoint `s` into `tmp` (fsynced by the writers).
void write_checkpoint_files(const fs::path& tmp, const Config& c, const DrafterWeights& w,
                            const AdamW& opt, const TrainerState& s) {
  safetensors::NamedTensors params;
  for (auto& [n, p] : named(w)) params.emplace_back(n, p.detach().contiguous());
  safetensors::write((tmp / "model.safetensors").string(), params, {{"format", "pt"}});
  maybe_crash(s.step);
  maybe_fill_disk(s.step);
  safetensors::write((tmp / "optimizer.safetensors").string(), opt.state(),
                     {{"format", "dflash-adamw-v1"}});
  safetensors::write_file_atomic((tmp / "config.json").string(),
                                 drafter_config_json(c).dump(2) + "\n");
  const nlohmann::json state = {
      {"step", s.step},
      {"cursor", s.cursor},
      {"optimizer_steps", opt.steps_taken()},
      {"threads",
       at::get_num_threads()},  // CPU reductions split by thread: bit-exactness needs the same
      {"rng",
       {{"scheme",
         "derive_seed(run.seed, stream, index): anchors and data order are "
         "functions of the micro-batch index, no generator state"},
        {"seed", c.run.seed}}},
      {"cwd", fs::current_path().string()},  // what the config's relative paths are relative to
      {"config", config_to_json(c)}};
  safetensors::write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2) + "\n");
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const Config& c, const DrafterWeights& w,
                            const AdamW& opt, const TrainerState& s) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path final_dir = root / step_name(s.step);
  if (fs::exists(final_dir / "trainer_state.json")) return final_dir.string();  // resumed, no step
  const fs::path tmp = root / fmt::format(".tmp-{}-{}", step_name(s.step), ::getpid());
  try {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    write_checkpoint_files(tmp, c, w, opt, s);
    fs::remove_all(final_dir);  // an incomplete leftover (no trainer_state.json)
    fs::rename(tmp, final_dir);
  } catch (const std::exception& e) {
    std::error_code ec;  // the partial write goes; the previous checkpoints stay as they were
    fs::remove_all(tmp, ec);
    throw CheckpointError(
        fmt::format("{}: writing checkpoint {} failed: {}; removed the partial write {}{}",
                    final_dir.string(), step_name(s.step), e.what(), tmp.string(),
                    ec ? fmt::format(" (could not remove it: {})", ec.message()) : std::string()));
  }
  safetensors::fsync_path(root.string());
  safetensors::write_file_atomic((root / "latest").string(), step_name(s.step) + "\n");
  prune(root, c.train.keep_checkpoints);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints(fs::path(run_dir) / "checkpoints");
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

ResumePoint newest_intact_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints(fs::path(run_dir) / "checkpoints");
  ResumePoint rp;
  for (auto it = all.rbegin(); it != all.rend() && !rp.ck; ++it) {
    try {
      rp.ck = read_checkpoint(it->second.string());
    } catch (const std::exception& e) {  // unreadable JSON, truncated or garbled tensors
      rp.damaged_dirs.push_back(it->second.string());
      rp.damaged_reasons.push_back(e.what());
    }
  }
  if (!rp.ck && !rp.damaged_dirs.empty()) {
    std::string each;
    for (size_t i = 0; i < rp.damaged_dirs.size(); ++i)
      each += fmt::format("\n  {}: {}", rp.damaged_dirs[i], rp.damaged_reasons[i]);
    throw CheckpointError(fmt::format(
        "{}/checkpoints: no intact checkpoint to resume from; every one is damaged:{}\nnot "
        "resuming (move them aside to start over, or use another --out-dir)",
        run_dir, each));
  }
  return rp;
}

std::string set_aside_damaged(const std::string& dir) {
  const fs::path from(dir);
  const fs::path to =
      from.parent_path() / fmt::format("damaged-{}-{}", from.filename().string(), ::getpid());
  fs::rename(from, to);
  return to.string();
}

void parse_trainer_state(const std::string& text, const std::string& label, Checkpoint& ck) {
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: not valid JSON: {}", label, e.what()));
  }
  if (!st.is_object())
    throw CheckpointError(
        fmt::format("{}: expected a JSON object, found {}", label, st.type_name()));
  for (const char* k : {"step", "cursor", "optimizer_steps", "config"})
    if (!st.contains(k)) throw CheckpointError(fmt::format("{}: {}: missing", label, k));
  // An integer beyond int64 reads back negative and is refused with the rest.
  for (const char* k : {"step", "cursor", "optimizer_steps"})
    if (!st[k].is_number_integer() || st[k].get<int64_t>() < 0)
      throw CheckpointError(
          fmt::format("{}: {}: expected an integer >= 0, found {}", label, k, st[k].dump()));
  if (!st["config"].is_object())
    throw CheckpointError(
        fmt::format("{}: config: expected an object, found {}", label, st["config"].type_name()));
  // threads: the intra-op count the run had (0 = unknown), for the resume warning.
  if (st.contains("threads") &&
      (!st["threads"].is_number_integer() || st["threads"].get<int64_t>() < 0 ||
       st["threads"].get<int64_t>() > 4096))
    throw CheckpointError(fmt::format("{}: threads: expected an integer in [0, 4096], found {}",
                                      label, st["threads"].dump()));
  ck.state = {st["step"].get<int64_t>(), st["cursor"].get<int64_t>()};
  ck.config = st["config"];
  ck.config["__optimizer_steps"] = st["optimizer_steps"];
  ck.threads = int(st.value("threads", int64_t(0)));
  // cwd: where the run started, for its config's relative paths (absent before).
  if (st.contains("cwd") && !st["cwd"].is_string())
    throw CheckpointError(
        fmt::format("{}: cwd: expected a string, found {}", label, st["cwd"].dump()));
  ck.cwd = st.value("cwd", std::string());
}

Checkpoint read_checkpoint(const std::string& dir) {
  Checkpoint ck;
  ck.dir = dir;
  const fs::path state = fs::path(dir) / "trainer_state.json";
  parse_trainer_state(read_whole_file<CheckpointError>(state.string()), state.string(), ck);
  auto read_into = [&](const char* file, std::map<std::string, at::Tensor>& dst) {
    const safetensors::File f = safetensors::read((fs::path(dir) / file).string());
    for (const auto& [n, t] : f.tensors) dst[n] = t;
  };
  read_into("model.safetensors", ck.params);
  read_into("optimizer.safetensors", ck.moments);
  return ck;
}

std::vector<std::string> check_same_run(const Checkpoint& ck, const Config& c) {
  if (ck.state.cursor != ck.state.step * c.train.micro_batches)
    throw CheckpointError(fmt::format(
        "{}/trainer_state.json: cursor {} is not step {} x train.micro_batches {}: written with "
        "another number of micro-batches per step; not resuming",
        ck.dir, ck.state.cursor, ck.state.step, c.train.micro_batches));
  if (c.train.steps < ck.state.step)
    throw CheckpointError(fmt::format(
        "{}: train.steps {} in {} is below the checkpoint's step {}; not resuming (a run "
        "continues from its recorded step)",
        ck.dir, c.train.steps, c.path, ck.state.step));
  std::map<std::string, nlohmann::json> there, here;
  nlohmann::json saved = ck.config;
  saved.erase("__optimizer_steps");
  flatten(saved, "", there);
  flatten(config_to_json(c), "", here);
  std::set<std::string> keys;
  for (const auto& [k, v] : there) keys.insert(k);
  for (const auto& [k, v] : here) keys.insert(k);
  std::vector<std::string> changed;
  for (const std::string& k : keys) {
    if (cadence_key(k)) continue;
    const auto a = there.find(k), b = here.find(k);
    const std::string va = a == there.end() ? "unset" : a->second.dump();
    const std::string vb = b == here.end() ? "unset" : b->second.dump();
    if (va == vb) continue;
    if (schedule_key(k)) {
      changed.push_back(fmt::format("{}: {} -> {}", k, va, vb));
      continue;
    }
    throw CheckpointError(
        fmt::format("{}: written by a different config: {} is {} there but {} in {}; not resuming "
                    "(use another --out-dir for a new run)",
                    ck.dir, k, va, vb, c.path));
  }
  return changed;
}

void restore(const Checkpoint& ck, const Config& c, DrafterWeights& w, AdamW& opt) {
  const std::string label = ck.dir + "/model.safetensors";
  const DrafterWeights loaded = bind_drafter(c, ck.params, master_type(c.run.dtype), label);
  {
    at::NoGradGuard ng;
    const NamedTensors src = named(loaded), dst = named(w);
    for (size_t i = 0; i < dst.size(); ++i) dst[i].second.detach().copy_(src[i].second);
  }
  opt.load_state(ck.moments, ck.config["__optimizer_steps"].get<int64_t>(),
                 ck.dir + "/optimizer.safetensors");
}

}  // namespace dflash::models
