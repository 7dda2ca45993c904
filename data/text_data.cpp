// Text data: UTF-8 documents, the byte tokenizer, packing into seq_len rows
// and prompts for self-distillation (data/data.h, docs/TRAINING.md).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/batch.h"
#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "data/data.h"

namespace dflash::data {
namespace fs = std::filesystem;
namespace {

// One document's text -> ids, refusing invalid UTF-8 and empty text.
TextDoc text_doc(const std::string& name, const std::string& text) {
  if (text.empty()) throw DataError(fmt::format("{}: empty text (nothing to train on)", name));
  if (const int64_t bad = first_invalid_utf8(text); bad >= 0)
    throw DataError(
        fmt::format("{}: byte offset {}: not valid UTF-8 (text data must be UTF-8)", name, bad));
  return {name, ByteTokenizer::encode(text)};
}

void read_jsonl_texts(const std::string& file, const std::string& body, std::vector<TextDoc>& out) {
  std::istringstream in(body);
  std::string line;
  const size_t before = out.size();
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", file, n);
    if (const int64_t bad = first_invalid_utf8(line); bad >= 0)
      throw DataError(
          fmt::format("{}: byte offset {} of the line: not valid UTF-8 (text data "
                      "must be UTF-8)",
                      where, bad));
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw DataError(fmt::format("{}: expected a JSON object {{\"text\": ...}}", where));
    const auto it = j.find("text");
    if (it == j.end() || !it->is_string())
      throw DataError(fmt::format("{}: text: expected a string, found {}", where,
                                  it == j.end() ? "nothing" : it->type_name()));
    out.push_back(text_doc(where, it->get<std::string>()));
  }
  if (out.size() == before)
    throw DataError(fmt::format("{}: expected JSONL texts, found none", file));
}

void read_text_file(const fs::path& p, std::vector<TextDoc>& out) {
  const std::string body = read_whole_file<DataError>(p.string(), "text file (data.path)");
  if (body.empty()) throw DataError(fmt::format("{}: empty file", p.string()));
  if (p.extension() == ".jsonl")
    read_jsonl_texts(p.string(), body, out);
  else
    out.push_back(text_doc(p.string(), body));
}

// The start of the first word at or after `o` within [o, end - P], else o.
int64_t word_start(const std::vector<int64_t>& ids, int64_t o, int64_t P) {
  const int64_t last = int64_t(ids.size()) - P;
  for (int64_t i = o; i <= last; ++i)
    if (i == 0 || ids[size_t(i - 1)] == ' ' || ids[size_t(i - 1)] == '\n') return i;
  return o;
}

}  // namespace

std::vector<TextDoc> read_text_documents(const std::string& path, const std::string& exclude) {
  std::vector<TextDoc> docs;
  if (!fs::exists(path))
    throw DataError(fmt::format("{}: data.path: no such text file or directory", path));
  if (!fs::is_directory(path)) {
    read_text_file(path, docs);
    return docs;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file() && !e.is_symlink() &&
        (exclude.empty() || !fs::exists(exclude) || !fs::equivalent(e.path(), exclude)))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) read_text_file(p, docs);
  if (docs.empty()) throw DataError(fmt::format("{}: expected text files, found none", path));
  return docs;
}

Dataset pack_text(const Config& c, const std::vector<TextDoc>& docs, const std::string& label) {
  const int64_t S = c.data.seq_len;
  int64_t rows = 0;
  for (const TextDoc& d : docs) rows += (int64_t(d.ids.size()) + S - 1) / S;
  Dataset out{label, at::zeros({rows, S}, at::kLong), at::zeros({rows, S}, at::kBool), {}, {}};
  int64_t r = 0;
  for (const TextDoc& d : docs)
    for (size_t o = 0; o < d.ids.size(); o += size_t(S), ++r) {
      const int64_t n = std::min<int64_t>(S, int64_t(d.ids.size() - o));
      std::copy(d.ids.begin() + int64_t(o), d.ids.begin() + int64_t(o) + n,
                out.input_ids.data_ptr<int64_t>() + r * S);
      out.loss_mask[r].narrow(0, 0, n).fill_(true);
    }
  return out;
}

at::Tensor text_prompts(const Config& c, const std::vector<TextDoc>& docs, int64_t count,
                        const std::string& stream, int64_t* skipped) {
  const int64_t P = c.data.prompt_len;
  std::vector<const TextDoc*> usable;
  std::vector<int64_t> starts;  // cumulative count of start offsets, per usable document
  int64_t total = 0, short_docs = 0;
  for (const TextDoc& d : docs) {
    if (int64_t(d.ids.size()) < P) {
      ++short_docs;
      continue;
    }
    usable.push_back(&d);
    total += int64_t(d.ids.size()) - P + 1;
    starts.push_back(total);
  }
  if (skipped) *skipped = short_docs;
  if (usable.empty())
    throw DataError(
        fmt::format("{}: every document is shorter than data.prompt_len = {} bytes; no prompt fits",
                    docs.empty() ? "text" : docs.front().name, P));
  at::Tensor out = at::empty({count, P}, at::kLong);  // (N, P)
  for (int64_t r = 0; r < count; ++r) {
    Rng rng(derive_seed(c.run.seed, stream, uint64_t(r)));
    const int64_t k = int64_t(rng.below(uint64_t(total)));
    const size_t d = size_t(std::upper_bound(starts.begin(), starts.end(), k) - starts.begin());
    const int64_t o = word_start(usable[d]->ids, k - (d ? starts[d - 1] : 0), P);
    std::copy(usable[d]->ids.begin() + o, usable[d]->ids.begin() + o + P,
              out.data_ptr<int64_t>() + r * P);
  }
  return out;
}

}  // namespace dflash::data
