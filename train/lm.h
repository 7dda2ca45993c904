// `dflash train-target`: trains the real-text target of the default run, a
// tiny Qwen3 causal LM over the byte tokenizer (core/byte_tokenizer.h), on
// English text every Debian machine carries (/usr/share/common-licenses, from
// base-files), and writes it as a Hugging Face directory
// (fixtures/targets/qwen3-bytes; docs/TRAINING.md "The real-text target").
//
// One seeded run: the corpus is every regular file of `corpus` in name order
// (symlinks such as GPL -> GPL-3 skipped) except `holdout`, each followed by
// the end token; batches are seeded windows of seq_len + 1 bytes of that
// stream; AdamW with warmup and cosine decay. The held-out document is only
// evaluated: bits per byte of the written model, read back through dflash's
// own Hugging Face loader and reference forward, beside a unigram baseline
// (byte frequencies of the training stream, add-one smoothed).
#pragma once

#include <cstdint>
#include <string>

namespace dflash::train {

struct LmRecipe {
  std::string corpus = "/usr/share/common-licenses";
  std::string holdout = "Apache-2.0";  // file name inside corpus, evaluated only
  std::string out;                     // the Hugging Face directory to write
  int64_t hidden_size = 128, num_layers = 4, num_heads = 4, num_kv_heads = 2, head_dim = 32;
  int64_t intermediate_size = 384;
  int64_t seq_len = 256, batch_size = 16, steps = 1000, warmup_steps = 30;
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0.0, clip_norm = 1.0;
  double init_std = 0.02;
  uint64_t seed = 20261203;
  int64_t threads = 0;  // 0: every core
  int64_t log_every = 25;
};

struct LmResult {
  double heldout_bpb = 0;  // reference forward of the written directory
  double train_bpb = 0;    // the training stream's first 32 windows
  double unigram_bpb = 0;  // add-one smoothed byte frequencies of the training stream
  int64_t train_bytes = 0, heldout_bytes = 0;
  double seconds = 0;
};

// Trains and writes recipe.out: config.json, model.safetensors,
// byte_tokenizer.json, generation_config.json, training_log.txt, result.json.
// Corpus errors (missing directory or holdout, invalid UTF-8, empty files)
// throw std::runtime_error naming the file.
LmResult train_byte_lm(const LmRecipe& r);

// Held-out bits per byte of an existing byte-LM directory on `text_file`
// (through load_hf_target and the reference forward), windows of seq_len.
double byte_lm_bits_per_byte(const std::string& model_dir, const std::string& text_file,
                             int64_t seq_len);

}  // namespace dflash::train
