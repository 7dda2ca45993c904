// Training data (docs/TRAINING.md): where samples come from and how they
// become (B, S) micro-batches.
//
// Sources (data.source): "fixture" (fixtures::make_batch, the default of the
// harness configs), "inline" (the config's rows), "jsonl" (one pre-tokenised
// sample per line: {"input_ids": [...], "loss_mask": [...]}), "shards" (a
// directory of safetensors files holding input_ids and loss_mask, (n, S')),
// "features" (a directory written by `dflash features`: the samples plus the
// target's tapped features and final hidden states, so no target is loaded),
// "self_distill" (greedy continuations by the target of seeded prompts, or of
// prompts drawn from the text at data.path), "text" (UTF-8 text, byte
// tokenized, see pack_text).
//
// Every sample is truncated or padded (token 0, loss_mask 0) to data.seq_len.
// Micro-batch g takes samples g*B .. g*B+B-1 of a seeded permutation of the
// training set, epoch after epoch: the data cursor is g itself, so a resumed
// run reads exactly what an uninterrupted one reads.
#pragma once

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::data {

struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Samples packed to fixed length.
struct Dataset {
  std::string label;         // where it came from, for messages
  at::Tensor input_ids;      // (N, S) int64
  at::Tensor loss_mask;      // (N, S) bool
  at::Tensor features;       // (N, S, L*H) source = "features" only, else undefined
  at::Tensor target_hidden;  // (N, S, H)   source = "features" only
  int64_t size() const { return input_ids.defined() ? input_ids.size(0) : 0; }
  bool has_features() const { return features.defined(); }
};

// Pre-tokenised JSONL; errors name the file and line. Ids must be in
// [0, vocab) and not the mask token.
Dataset read_jsonl(const Config& c, const std::string& path);
// The same from the file's text; `path` names it in messages.
Dataset parse_jsonl(const Config& c, const std::string& text, const std::string& path);
// A directory of *.safetensors shards (or the ones index.json lists).
Dataset read_shards(const Config& c, const std::string& dir);
// `dflash features` output; `split` is "train" or "eval". Checks the
// directory was written for this config's target taps, hidden size, seq_len.
Dataset read_features(const Config& c, const std::string& dir, const std::string& split);
// The frozen embedding / LM head stored beside the features.
FrozenWeights read_features_frozen(const Config& c, const std::string& dir);
// Text (docs/TRAINING.md "Text data"), tokenized by the byte tokenizer
// (core/byte_tokenizer.h): one document is a UTF-8 file, or one line
// {"text": "..."} of a .jsonl file; a directory holds such files (regular
// files in name order, symlinks skipped, the file `exclude` left out).
// Invalid UTF-8, an empty file or an empty text is a DataError naming the
// file (and line, and byte offset).
struct TextDoc {
  std::string name;          // the file, or file:line
  std::vector<int64_t> ids;  // byte ids
};
std::vector<TextDoc> read_text_documents(const std::string& path, const std::string& exclude = "");

// data.source = "text": document after document, each cut into rows of
// data.seq_len bytes (loss_mask 1); a document's last row is padded (token 0,
// loss_mask 0). Every byte of every document is in exactly one row.
Dataset pack_text(const Config& c, const std::vector<TextDoc>& docs, const std::string& label);

// `count` prompts of data.prompt_len bytes (N, prompt_len): prompt r starts at
// a seeded byte offset over all documents (longer documents are drawn more
// often), moved forward to the next word start when one fits. Documents
// shorter than prompt_len cannot hold a prompt and are skipped (counted in
// `skipped`); none long enough is a DataError.
at::Tensor text_prompts(const Config& c, const std::vector<TextDoc>& docs, int64_t count,
                        const std::string& stream, int64_t* skipped = nullptr);

// Greedy continuations by the target of `count` prompts (data.prompt_len
// tokens, loss_mask 0) up to data.seq_len (loss_mask 1). The prompts are
// seeded random tokens, or drawn from `text` (text_prompts) when given.
Dataset self_distill(const Config& c, const TargetWeights& target, int64_t count,
                     const std::string& stream, const std::vector<TextDoc>* text = nullptr);

// The training and held-out sets of a config. For "fixture" and "inline"
// they are empty (batches come from fixtures::make_batch). Without
// data.eval_path the last data.eval_samples samples are held out.
struct DataSplit {
  Dataset train, eval;
};
DataSplit load_data(const Config& c, const TargetWeights* target);

struct MicroBatch {
  at::Tensor input_ids;      // (B, S) int64
  at::Tensor loss_mask;      // (B, S) bool
  at::Tensor features;       // (B, S, L*H) or undefined
  at::Tensor target_hidden;  // (B, S, H) or undefined
};

// Training micro-batch g (shuffled, epochs) and held-out micro-batch i (in order).
MicroBatch train_batch(const Config& c, const Dataset& d, int64_t g);
MicroBatch eval_batch(const Config& c, const Dataset& d, int64_t i);

// Who runs the target for `dflash features`: dflash's own forward ("dflash",
// qwen3 and llama targets) or transformers' model class ("transformers",
// python/dflash/hf_features.py, any architecture it loads); "auto" picks
// dflash when it can.
struct FeatureEngine {
  std::string name = "auto";
  std::string python;      // the torch environment's python (transformers in it)
  std::string pythonpath;  // put first on PYTHONPATH: this checkout's python/
};

// `dflash features --config C --out DIR`: runs the target over the config's
// training and held-out sets and writes shards of `shard_samples` samples.
int write_features(const Config& c, const std::string& out_dir, int64_t shard_samples,
                   const FeatureEngine& engine = {});

}  // namespace dflash::data
