// Training data: readers with file/line errors, self-distillation, packing,
// the shuffled cursor, and `dflash features`.
#include "data/data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/batch.h"
#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "core/step.h"
#include "fixtures/fixtures.h"
#include "models/generate.h"
#include "models/hf.h"

namespace dflash::data {
namespace fs = std::filesystem;
namespace {

// A token id must be a real token: in [0, V) and not the mask token.
void check_token(const Config& c, int64_t id, const std::string& where) {
  if (id < 0 || id >= c.target.vocab_size)
    throw DataError(
        fmt::format("{}: input_ids: expected token ids in [0, {}) (target.vocab_size), "
                    "found {}",
                    where, c.target.vocab_size, id));
  if (id == c.data.mask_token_id)
    throw DataError(
        fmt::format("{}: input_ids: found the mask token id {} (data.mask_token_id); "
                    "it may not appear in data",
                    where, id));
}

// Copies one ragged sample into row r of the packed tensors (truncate / pad).
void pack_row(const std::vector<int64_t>& ids, const std::vector<int64_t>& mask,
              at::Tensor& out_ids, at::Tensor& out_mask, int64_t r) {
  const int64_t S = out_ids.size(1), n = std::min<int64_t>(S, int64_t(ids.size()));
  int64_t* pi = out_ids.data_ptr<int64_t>() + r * S;
  bool* pm = out_mask.data_ptr<bool>() + r * S;
  for (int64_t s = 0; s < n; ++s) pi[s] = ids[size_t(s)], pm[s] = mask[size_t(s)] != 0;
}

std::vector<int64_t> json_ints(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key))
    throw DataError(fmt::format("{}: {}: expected an array, found nothing", where, key));
  const nlohmann::json& a = j[key];
  if (!a.is_array())
    throw DataError(fmt::format("{}: {}: expected an array, found {}", where, key, a.type_name()));
  std::vector<int64_t> out;
  out.reserve(a.size());
  for (const auto& e : a) {
    if (e.is_boolean())
      out.push_back(e.get<bool>() ? 1 : 0);
    else if (e.is_number_integer())
      out.push_back(e.get<int64_t>());
    else
      throw DataError(fmt::format("{}: {}: expected integers, found {}", where, key, e.dump()));
  }
  return out;
}

// One JSONL line -> (ids, mask), validated.
void parse_jsonl_line(const Config& c, const std::string& line, const std::string& where,
                      std::vector<int64_t>& ids, std::vector<int64_t>& mask) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", where, e.what()));
  }
  if (!j.is_object())
    throw DataError(fmt::format("{}: expected a JSON object, found {}", where, j.type_name()));
  if (!j.contains("input_ids") && j.contains("text"))
    throw DataError(fmt::format(
        "{}: input_ids: expected token ids, found a \"text\" field: data.source = \"jsonl\" "
        "reads pre-tokenised rows {{\"input_ids\", \"loss_mask\"}}; for text use data.source "
        "= \"text\" (byte-tokenized)",
        where));
  ids = json_ints(j, "input_ids", where);
  mask = json_ints(j, "loss_mask", where);
  if (ids.size() != mask.size())
    throw DataError(fmt::format("{}: loss_mask: expected {} entries (as input_ids), found {}",
                                where, ids.size(), mask.size()));
  if (ids.empty())
    throw DataError(fmt::format("{}: input_ids: expected at least one token, found none", where));
  for (int64_t id : ids) check_token(c, id, where);
  for (int64_t m : mask)
    if (m != 0 && m != 1)
      throw DataError(fmt::format("{}: loss_mask: expected 0 or 1, found {}", where, m));
}

Dataset make_packed(const std::string& label, int64_t n, int64_t S) {
  return {label, at::zeros({n, S}, at::kLong), at::zeros({n, S}, at::kBool), {}, {}};
}

at::Tensor read_index_tensor(const safetensors::File& f, const char* name) {
  const at::Tensor& t = f.get(name);
  if (t.dim() != 2 || (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt &&
                       t.scalar_type() != at::kByte && t.scalar_type() != at::kBool))
    throw DataError(fmt::format("{}: {}: expected a 2-D integer or bool tensor (n, S), found {} {}",
                                f.label, name, at::toString(t.scalar_type()),
                                shape_text(t.sizes())));
  return t.to(at::kLong);
}

std::vector<std::string> shard_files(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw DataError(
        fmt::format("{}: data.path: expected a directory of safetensors shards, found none", dir));
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "index.json";
  if (fs::exists(index)) {
    const nlohmann::json j =
        parse_json<DataError>(read_whole_file<DataError>(index.string()), index.string());
    if (!j.contains("shards") || !j["shards"].is_array())
      throw DataError(fmt::format("{}: shards: expected an array of file names", index.string()));
    for (const auto& s : j["shards"]) {
      if (!s.is_string())
        throw DataError(
            fmt::format("{}: shards: expected file names, found {}", index.string(), s.dump()));
      const fs::path p = fs::path(dir) / s.get<std::string>();
      if (!fs::exists(p))
        throw DataError(fmt::format("{}: shards: lists {}, which does not exist (missing shard)",
                                    index.string(), p.string()));
      files.push_back(p.string());
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  }
  if (files.empty())
    throw DataError(fmt::format("{}: expected *.safetensors shards, found none", dir));
  return files;
}

Dataset holdout_tail(Dataset& d, int64_t n) {
  const int64_t N = d.size();
  if (n >= N)
    throw DataError(
        fmt::format("{}: data.eval_samples = {} leaves no training samples ({} in all); "
                    "lower it or give data.eval_path",
                    d.label, n, N));
  auto tail = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, N - n, n) : t; };
  auto head = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, 0, N - n) : t; };
  Dataset e{d.label + " (held out)", tail(d.input_ids), tail(d.loss_mask), tail(d.features),
            tail(d.target_hidden)};
  d = {d.label, head(d.input_ids), head(d.loss_mask), head(d.features), head(d.target_hidden)};
  return e;
}

// Text is byte-tokenized: a Hugging Face target must say it was trained on
// that tokenizer (byte_tokenizer.json) and agree on the mask id.
void check_byte_tokenizer(const Config& c) {
  if (c.target.source != "hf") return;
  bool has = false;
  try {
    has = has_byte_tokenizer(c.target.path);
  } catch (const std::runtime_error& e) {
    throw DataError(e.what());
  }
  if (!has)
    throw DataError(fmt::format(
        "{}: no {}: data.source \"{}\" tokenizes text into bytes, and this target was not "
        "trained on that tokenizer (give pre-tokenized data: jsonl or shards)",
        c.target.path, kByteTokenizerFile, c.data.source));
  if (c.data.mask_token_id != ByteTokenizer::kMask)
    throw DataError(fmt::format(
        "{}: data.mask_token_id: expected {} (the mask id of {}/{}), "
        "found {}",
        c.path, ByteTokenizer::kMask, c.target.path, kByteTokenizerFile, c.data.mask_token_id));
}

// SPEC: position a is an anchor candidate when a <= S-2 and loss_mask[a]
// and loss_mask[a+1]. A set in which no row has one (all-zero masks, or only
// isolated ones) trains to loss 0 and gradient norm 0: refused before any
// step runs, naming the set and where it came from. Some empty rows are fine.
void require_anchor_candidates(const Config& c, const Dataset& d, const char* set,
                               const char* key) {
  const int64_t N = d.size(), S = d.loss_mask.defined() ? d.loss_mask.size(1) : 0;
  if (N == 0) return;
  if (S >= 2) {
    const at::Tensor m = d.loss_mask.to(at::kBool);
    if ((m.narrow(1, 0, S - 1) & m.narrow(1, 1, S - 1)).any().item<bool>()) return;
  }
  throw DataError(fmt::format(
      "{}: loss_mask: every one of its {} rows has no two consecutive loss_mask ones within "
      "data.seq_len = {}, so no position can be an anchor: the {} ({}) {}",
      d.label, N, c.data.seq_len, set, key,
      std::string(set) == "held-out set" ? "has nothing to measure"
                                         : "would train nothing (loss 0, gradient norm 0)"));
}

// The config's inline rows (data.source = "inline"), held to the same rule.
void require_inline_candidates(const Config& c) {
  Dataset d;
  d.label = c.path;
  const int64_t N = int64_t(c.data.loss_mask.size());
  d.loss_mask = at::zeros({N, c.data.seq_len}, at::kBool);
  d.input_ids = at::zeros({N, 1}, at::kLong);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t t = 0; t < std::min<int64_t>(c.data.seq_len, c.data.loss_mask[r].size()); ++t)
      d.loss_mask[r][t] = c.data.loss_mask[r][t] != 0;
  require_anchor_candidates(c, d, "inline batch", "data.loss_mask");
}

Dataset read_source(const Config& c, const std::string& path) {
  if (c.data.source == "jsonl") return read_jsonl(c, path);
  return read_shards(c, path);
}

MicroBatch rows(const Dataset& d, const std::vector<int64_t>& idx) {
  const at::Tensor i = at::tensor(idx, at::kLong);
  MicroBatch b{d.input_ids.index_select(0, i), d.loss_mask.index_select(0, i), {}, {}};
  if (d.has_features())
    b.features = d.features.index_select(0, i),
    b.target_hidden = d.target_hidden.index_select(0, i);
  return b;
}

}  // namespace

Dataset read_jsonl(const Config& c, const std::string& path) {
  return parse_jsonl(c, read_whole_file<DataError>(path, "data file (data.path)"), path);
}

Dataset parse_jsonl(const Config& c, const std::string& text, const std::string& path) {
  std::istringstream in(text);
  std::vector<std::vector<int64_t>> all_ids, all_mask;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    all_ids.emplace_back(), all_mask.emplace_back();
    parse_jsonl_line(c, line, fmt::format("{}:{}", path, lineno), all_ids.back(), all_mask.back());
  }
  if (all_ids.empty()) throw DataError(fmt::format("{}: expected JSONL samples, found none", path));
  // A row longer than seq_len becomes several samples of seq_len tokens (the
  // last one padded), as text does: nothing is cut away unsaid.
  const size_t S = size_t(c.data.seq_len);
  std::vector<std::pair<size_t, size_t>> pieces;  // (row, first token)
  int64_t long_rows = 0;
  for (size_t r = 0; r < all_ids.size(); ++r) {
    long_rows += all_ids[r].size() > S;
    for (size_t o = 0; o < all_ids[r].size(); o += S) pieces.emplace_back(r, o);
  }
  Dataset d = make_packed(path, int64_t(pieces.size()), c.data.seq_len);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto [r, o] = pieces[k];
    const size_t e = std::min(all_ids[r].size(), o + S);
    pack_row({all_ids[r].begin() + long(o), all_ids[r].begin() + long(e)},
             {all_mask[r].begin() + long(o), all_mask[r].begin() + long(e)}, d.input_ids,
             d.loss_mask, int64_t(k));
  }
  if (long_rows > 0)
    d.label += fmt::format(" ({} of {} rows longer than data.seq_len = {} split into {} samples)",
                           long_rows, all_ids.size(), S,
                           int64_t(pieces.size()) - int64_t(all_ids.size()) + long_rows);
  return d;
}

Dataset read_shards(const Config& c, const std::string& dir) {
  std::vector<at::Tensor> ids, masks;
  for (const std::string& file : shard_files(dir)) {
    const safetensors::File f = safetensors::read(file);
    at::Tensor i = read_index_tensor(f, "input_ids"), m = read_index_tensor(f, "loss_mask");
    if (i.sizes() != m.sizes())
      throw DataError(fmt::format("{}: loss_mask: expected shape {} (as input_ids), found {}", file,
                                  shape_text(i.sizes()), shape_text(m.sizes())));
    if (i.numel() == 0)
      throw DataError(fmt::format("{}: input_ids: expected samples, found none", file));
    const int64_t lo = i.min().item<int64_t>(), hi = i.max().item<int64_t>();
    check_token(c, lo, file), check_token(c, hi, file);
    if ((i == c.data.mask_token_id).any().item<bool>()) check_token(c, c.data.mask_token_id, file);
    if (((m != 0) & (m != 1)).any().item<bool>())
      throw DataError(fmt::format("{}: loss_mask: expected 0 or 1 entries", file));
    const int64_t S = c.data.seq_len, n = std::min(S, i.size(1));
    at::Tensor pi = at::zeros({i.size(0), S}, at::kLong), pm = at::zeros({i.size(0), S}, at::kBool);
    pi.narrow(1, 0, n).copy_(i.narrow(1, 0, n));
    pm.narrow(1, 0, n).copy_(m.narrow(1, 0, n) != 0);
    ids.push_back(pi), masks.push_back(pm);
  }
  return {dir, at::cat(ids), at::cat(masks), {}, {}};
}

Dataset self_distill(const Config& c, const TargetWeights& target, int64_t count,
                     const std::string& stream, const std::vector<TextDoc>* text) {
  const int64_t S = c.data.seq_len, P = c.data.prompt_len, V = c.target.vocab_size;
  Dataset d = make_packed("self_distill:" + stream, count, S);
  if (text) {
    int64_t skipped = 0;
    d.input_ids.narrow(1, 0, P).copy_(text_prompts(c, *text, count, stream, &skipped));
    d.label += fmt::format(
        " (prompts from {} text documents{})", text->size(),
        skipped ? fmt::format(", {} shorter than the prompt skipped", skipped) : std::string());
  } else {
    for (int64_t r = 0; r < count; ++r) {
      Rng rng(derive_seed(c.run.seed, stream, uint64_t(r)));
      for (int64_t p = 0; p < P; ++p) {
        int64_t tok = int64_t(rng.below(uint64_t(V - 1)));
        d.input_ids[r][p] = tok >= c.data.mask_token_id ? tok + 1 : tok;  // never the mask token
      }
    }
  }
  d.loss_mask.narrow(1, P, S - P).fill_(true);
  const int64_t chunk = 512;  // rows decoded together
  for (int64_t r0 = 0; r0 < count; r0 += chunk) {
    at::Tensor ids = d.input_ids.narrow(0, r0, std::min(chunk, count - r0)).contiguous();
    models::greedy_continue(c, target, ids, P, c.data.mask_token_id);
    d.input_ids.narrow(0, r0, ids.size(0)).copy_(ids);
  }
  return d;
}

namespace {

// Whether a self_distill path holds prepared conversations (`dflash
// prepare`'s JSONL: its first record has "input_ids"), not prompt text.
bool token_rows(const std::string& path) {
  if (path.empty() || !std::filesystem::is_regular_file(path)) return false;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    return j.is_object() && j.contains("input_ids");
  }
  return false;
}

// Conversations answered by the target (models::greedy_answers): the
// dataset's assistant turns replaced by the target's own.
Dataset answered_by_target(const Config& c, const TargetWeights& target, Dataset d) {
  const int64_t chunk = 16;  // conversations decoded side by side
  for (int64_t r0 = 0; r0 < d.size(); r0 += chunk) {
    const int64_t n = std::min(chunk, d.size() - r0);
    at::Tensor ids = d.input_ids.narrow(0, r0, n).clone(),
               mask = d.loss_mask.narrow(0, r0, n).clone();
    models::greedy_answers(c, target, ids, mask, c.data.mask_token_id);
    d.input_ids.narrow(0, r0, n).copy_(ids), d.loss_mask.narrow(0, r0, n).copy_(mask);
  }
  d.label = fmt::format("self_distill: {} conversations of {}, answers regenerated by the target",
                        d.size(), d.label);
  return d;
}

DataSplit load_sets(const Config& c, const TargetWeights* target) {
  const DataConfig& dc = c.data;
  DataSplit s;
  if (dc.source == "fixture" || dc.source == "inline") return s;
  if (dc.source == "self_distill" && token_rows(dc.path)) {
    TORCH_CHECK(target, "self_distill needs the target");
    s.train = read_jsonl(c, dc.path);
    if (!dc.eval_path.empty())
      s.eval = read_jsonl(c, dc.eval_path);
    else if (dc.eval_samples > 0)
      s.eval = holdout_tail(s.train, dc.eval_samples);
    s.train = answered_by_target(c, *target, std::move(s.train));
    if (s.eval.size() > 0) s.eval = answered_by_target(c, *target, std::move(s.eval));
    return s;
  }
  if (dc.byte_text()) check_byte_tokenizer(c);
  if (dc.source == "self_distill") {
    TORCH_CHECK(target, "self_distill needs the target");
    std::vector<TextDoc> text, eval_text;
    if (!dc.path.empty()) text = read_text_documents(dc.path, dc.eval_path);
    if (!dc.eval_path.empty()) eval_text = read_text_documents(dc.eval_path);
    const std::vector<TextDoc>* prompts = dc.path.empty() ? nullptr : &text;
    s.train = self_distill(c, *target, dc.num_samples, "self_distill", prompts);
    if (dc.eval_samples > 0)
      s.eval = self_distill(c, *target, dc.eval_samples, "self_distill_eval",
                            dc.eval_path.empty() ? prompts : &eval_text);
    return s;
  }
  if (dc.source == "text") {
    const auto text = [&](const std::string& path, const std::string& exclude) {
      const std::vector<TextDoc> docs = read_text_documents(path, exclude);
      return pack_text(c, docs, fmt::format("text {} ({} documents)", path, docs.size()));
    };
    s.train = text(dc.path, dc.eval_path);
    if (!dc.eval_path.empty())
      s.eval = text(dc.eval_path, "");
    else if (dc.eval_samples > 0)
      s.eval = holdout_tail(s.train, dc.eval_samples);
    return s;
  }
  if (dc.source == "features") {
    s.train = read_features(c, dc.path, "train");
    if (dc.eval_path.empty()) {
      s.eval = read_features(c, dc.path, "eval");
    } else {  // another features directory: its held-out split, else its training split
      s.eval = read_features(c, dc.eval_path, "eval");
      if (s.eval.size() == 0) s.eval = read_features(c, dc.eval_path, "train");
    }
    return s;
  }
  s.train = read_source(c, dc.path);
  if (!dc.eval_path.empty())
    s.eval = read_source(c, dc.eval_path);
  else if (dc.eval_samples > 0)
    s.eval = holdout_tail(s.train, dc.eval_samples);
  return s;
}

}  // namespace

DataSplit load_data(const Config& c, const TargetWeights* target) {
  if (c.data.source == "inline") require_inline_candidates(c);
  DataSplit s = load_sets(c, target);
  require_anchor_candidates(c, s.train, "training set", "data.path");
  require_anchor_candidates(c, s.eval, "held-out set",
                            c.data.eval_path.empty() ? "data.eval_samples" : "data.eval_path");
  return s;
}

MicroBatch train_batch(const Config& c, const Dataset& d, int64_t g) {
  const int64_t B = c.data.batch_size;
  if (d.size() == 0) {
    const fixtures::Batch b = fixtures::make_batch(c, uint64_t(g));
    return {b.input_ids, b.loss_mask, {}, {}};
  }
  const int64_t N = d.size();
  std::vector<int64_t> idx, perm;
  int64_t perm_epoch = -1;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t k = g * B + i, epoch = k / N;
    if (epoch != perm_epoch) {  // this epoch's seeded order (Fisher-Yates)
      perm.resize(size_t(N));
      for (int64_t j = 0; j < N; ++j) perm[size_t(j)] = j;
      Rng rng(derive_seed(c.run.seed, "data_order", uint64_t(epoch)));
      for (int64_t j = N - 1; j > 0; --j)
        std::swap(perm[size_t(j)], perm[size_t(rng.below(uint64_t(j + 1)))]);
      perm_epoch = epoch;
    }
    idx.push_back(perm[size_t(k % N)]);
  }
  return rows(d, idx);
}

MicroBatch eval_batch(const Config& c, const Dataset& d, int64_t i) {
  const int64_t B = c.data.batch_size;
  if (d.size() == 0) {
    const fixtures::Batch b = fixtures::make_batch(c, (uint64_t(1) << 40) + uint64_t(i));
    return {b.input_ids, b.loss_mask, {}, {}};
  }
  std::vector<int64_t> idx;
  for (int64_t r = 0; r < B; ++r) idx.push_back((i * B + r) % d.size());
  return rows(d, idx);
}

}  // namespace dflash::data
