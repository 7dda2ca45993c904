// The byte-level LM trainer behind `dflash train-target` (train/lm.h).
#include "train/lm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/batch.h"
#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "core/hash.h"
#include "core/init.h"
#include "core/optim.h"
#include "core/safetensors.h"
#include "core/step.h"
#include "data/data.h"
#include "models/generate.h"
#include "models/hf.h"
#include "reference/layers.h"
#include "reference/target.h"

namespace dflash::train {
namespace fs = std::filesystem;
namespace {

struct Corpus {
  std::vector<int64_t> train, heldout;  // token streams, each document + end
  std::string listing;                  // file, bytes, fnv1a64 per line (the log)
};

// The corpus directory through the text source's reader (UTF-8, regular
// files in name order, symlinks skipped): the holdout apart, each document
// followed by the end id.
Corpus read_corpus(const LmRecipe& r) {
  if (!fs::is_directory(r.corpus))
    throw std::runtime_error(fmt::format("{}: --corpus: not a directory", r.corpus));
  Corpus c;
  bool found_holdout = false;
  for (const data::TextDoc& d : data::read_text_documents(r.corpus)) {
    const std::string name = fs::path(d.name).filename().string();
    const bool held = name == r.holdout;
    found_holdout |= held;
    std::vector<int64_t>& dst = held ? c.heldout : c.train;
    dst.insert(dst.end(), d.ids.begin(), d.ids.end());
    dst.push_back(ByteTokenizer::kEnd);
    c.listing += fmt::format("  {:<12} {:>7} bytes  fnv1a64 {:016x}{}\n", name, d.ids.size(),
                             fnv1a64(ByteTokenizer::decode(d.ids)), held ? "  (held out)" : "");
  }
  if (!found_holdout)
    throw std::runtime_error(fmt::format("{}: --holdout {}: no such file", r.corpus, r.holdout));
  if (int64_t(c.train.size()) <= r.seq_len + 1)
    throw std::runtime_error(
        fmt::format("{}: {} training bytes, fewer than one window of --seq-len {}", r.corpus,
                    c.train.size(), r.seq_len));
  return c;
}

Config lm_config(const LmRecipe& r) {
  Config c;
  c.path = "dflash train-target";
  c.target.source = "fixture";
  c.target.vocab_size = ByteTokenizer::kVocab;
  c.target.num_hidden_layers = r.num_layers;
  LayerShape layer;  // rope_theta, rms_norm_eps: the defaults (1e6, 1e-6)
  layer.hidden_size = r.hidden_size, layer.intermediate_size = r.intermediate_size,
  layer.head_dim = r.head_dim;
  layer.num_attention_heads = r.num_heads, layer.num_key_value_heads = r.num_kv_heads;
  c.target.shape = layer;
  c.target.tie_word_embeddings = true;
  c.target.init_std = r.init_std;
  c.run.seed = r.seed;
  return c;
}

// Causal attention for training: GQA by repeating the key/value heads, then
// ATen's fused attention (the trained model is evaluated by the reference).
at::Tensor causal_attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t rep = q.size(1) / k.size(1);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                          v.repeat_interleave(rep, 1), {}, 0.0, true);
}

// Mean cross-entropy (nats) of next-byte prediction over `stream`, in
// non-overlapping windows of S (each window's first byte has no context).
double stream_nats(const Config& c, const TargetWeights& w, const std::vector<int64_t>& stream,
                   int64_t S, const reference::CausalAttentionFn& attend) {
  at::NoGradGuard ng;
  double total = 0;
  int64_t count = 0;
  for (size_t o = 0; o + 1 < stream.size(); o += size_t(S)) {
    const int64_t n = std::min<int64_t>(S, int64_t(stream.size() - o) - 1);
    const at::Tensor x =
        at::tensor(std::vector<int64_t>(stream.begin() + o, stream.begin() + o + n),
                   at::kLong)
            .unsqueeze(0);  // (1, n)
    const at::Tensor y = at::tensor(
        std::vector<int64_t>(stream.begin() + o + 1, stream.begin() + o + 1 + n), at::kLong);
    const at::Tensor h = reference::decoder_forward(c, w, x, attend, nullptr);  // (1, n, H)
    const at::Tensor logits = reference::project(h, w.lm_head).squeeze(0).to(at::kDouble);
    total += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    count += n;
  }
  return total / double(std::max<int64_t>(count, 1));
}

double unigram_bits(const std::vector<int64_t>& train, const std::vector<int64_t>& heldout) {
  std::vector<double> counts(size_t(ByteTokenizer::kVocab), 1.0);  // add-one
  for (int64_t t : train) counts[size_t(t)] += 1;
  double total = 0;
  for (double x : counts) total += x;
  double bits = 0;
  for (size_t i = 1; i < heldout.size(); ++i) bits -= std::log2(counts[size_t(heldout[i])] / total);
  return bits / double(heldout.size() - 1);
}

// A greedy continuation of the held-out document's opening, for the log.
std::string sample_text(const Config& c, const TargetWeights& w, const std::vector<int64_t>& held) {
  const int64_t P = std::min<int64_t>(48, int64_t(held.size())), S = P + 160;
  at::Tensor ids = at::zeros({1, S}, at::kLong);
  for (int64_t i = 0; i < P; ++i) ids[0][i] = held[size_t(i)];
  models::greedy_continue(c, w, ids, P, ByteTokenizer::kMask);
  std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + S);
  return fmt::format("[prompt] {}\n[greedy] {}", ByteTokenizer::decode({v.begin(), v.begin() + P}),
                     ByteTokenizer::decode({v.begin() + P, v.end()}));
}

nlohmann::json recipe_json(const LmRecipe& r) {
  return {{"corpus", r.corpus},
          {"holdout", r.holdout},
          {"hidden_size", r.hidden_size},
          {"num_layers", r.num_layers},
          {"num_heads", r.num_heads},
          {"num_kv_heads", r.num_kv_heads},
          {"head_dim", r.head_dim},
          {"intermediate_size", r.intermediate_size},
          {"seq_len", r.seq_len},
          {"batch_size", r.batch_size},
          {"steps", r.steps},
          {"warmup_steps", r.warmup_steps},
          {"lr", r.lr},
          {"min_lr_ratio", r.min_lr_ratio},
          {"weight_decay", r.weight_decay},
          {"clip_norm", r.clip_norm},
          {"init_std", r.init_std},
          {"seed", r.seed}};
}

// The written directory's extra files and the config.json fields a Hugging
// Face loader uses for generation (eos/pad ids).
void finish_directory(const LmRecipe& r, const LmResult& res, const std::string& log) {
  const fs::path dir(r.out);
  nlohmann::json cfg = parse_json(read_whole_file((dir / "config.json").string(), "config.json"),
                                  (dir / "config.json").string());
  cfg["bos_token_id"] = nullptr;
  cfg["eos_token_id"] = ByteTokenizer::kEnd;
  cfg["pad_token_id"] = ByteTokenizer::kPad;
  safetensors::write_file_atomic((dir / "config.json").string(), cfg.dump(2) + "\n");
  const nlohmann::json gen = {{"eos_token_id", ByteTokenizer::kEnd},
                              {"pad_token_id", ByteTokenizer::kPad},
                              {"do_sample", false}};
  safetensors::write_file_atomic((dir / "generation_config.json").string(), gen.dump(2) + "\n");
  safetensors::write_file_atomic((dir / kByteTokenizerFile).string(), byte_tokenizer_json());
  // The same tokenizer for transformers, with a chat template (dflash prepare).
  safetensors::write_file_atomic((dir / "tokenizer.json").string(), byte_hf_tokenizer_json());
  safetensors::write_file_atomic((dir / "tokenizer_config.json").string(),
                                 byte_hf_tokenizer_config_json());
  const nlohmann::json result = {{"recipe", recipe_json(r)},
                                 {"heldout_bits_per_byte", res.heldout_bpb},
                                 {"train_bits_per_byte", res.train_bpb},
                                 {"unigram_bits_per_byte", res.unigram_bpb},
                                 {"train_bytes", res.train_bytes},
                                 {"heldout_bytes", res.heldout_bytes},
                                 {"seconds", res.seconds}};
  safetensors::write_file_atomic((dir / "result.json").string(), result.dump(2) + "\n");
  safetensors::write_file_atomic((dir / "training_log.txt").string(), log);
}

}  // namespace

double byte_lm_bits_per_byte(const std::string& model_dir, const std::string& text_file,
                             int64_t seq_len) {
  Config c;
  c.target = read_hf_config(model_dir);
  c.target.source = "hf", c.target.path = model_dir;
  const TargetWeights w = models::load_hf_target(c);
  std::vector<int64_t> ids;
  for (const data::TextDoc& d : data::read_text_documents(text_file)) {
    ids.insert(ids.end(), d.ids.begin(), d.ids.end());
    ids.push_back(ByteTokenizer::kEnd);
  }
  return stream_nats(c, w, ids, seq_len, reference::dense_causal_attention) / std::log(2.0);
}

namespace {

// Training step `step`'s batch: B seeded windows of S + 1 bytes of the
// training stream, as inputs x (B, S) and next-byte labels y (B*S).
std::pair<at::Tensor, at::Tensor> lm_batch(const LmRecipe& r, const std::vector<int64_t>& stream,
                                           int64_t step) {
  const int64_t S = r.seq_len, B = r.batch_size, span = int64_t(stream.size()) - S - 1;
  Rng rng(derive_seed(r.seed, "lm_batch", uint64_t(step)));
  at::Tensor win = at::empty({B, S + 1}, at::kLong);  // (B, S + 1)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t o = int64_t(rng.below(uint64_t(span + 1)));
    std::copy(stream.begin() + o, stream.begin() + o + S + 1,
              win.data_ptr<int64_t>() + b * (S + 1));
  }
  return {win.narrow(1, 0, S), win.narrow(1, 1, S).reshape(-1)};
}

// The trainable leaves of a tied model (the head is the embedding's tensor).
NamedTensors lm_params(TargetWeights& w) {
  NamedTensors params;
  visit(w, [&](const std::string& n, at::Tensor& t) {
    if (n == "lm_head.weight") return;
    t.set_requires_grad(true);
    params.emplace_back(n, t);
  });
  return params;
}

// The figures of the written directory, evaluated as dflash will use it:
// read back through the Hugging Face loader, reference forward.
LmResult evaluate_written(const LmRecipe& r, const Config& c, const Corpus& corpus,
                          const std::function<void(const std::string&)>& say) {
  LmResult res;
  res.train_bytes = int64_t(corpus.train.size());
  res.heldout_bytes = int64_t(corpus.heldout.size());
  res.heldout_bpb =
      byte_lm_bits_per_byte(r.out, (fs::path(r.corpus) / r.holdout).string(), r.seq_len);
  Config rc = c;
  rc.target.source = "hf", rc.target.path = r.out;
  const TargetWeights back = models::load_hf_target(rc);
  // Training-text figure: the stream's first 32 windows (ATen's attention).
  const size_t head = std::min<size_t>(corpus.train.size(), size_t(32 * r.seq_len));
  res.train_bpb = stream_nats(rc, back, {corpus.train.begin(), corpus.train.begin() + head},
                              r.seq_len, causal_attend) /
                  std::log(2.0);
  say(sample_text(rc, back, corpus.heldout));
  res.unigram_bpb = unigram_bits(corpus.train, corpus.heldout);
  return res;
}

// Every option a usable value, before anything is read or written.
void check_recipe(const LmRecipe& r) {
  const auto fail = [](const std::string& flag, const std::string& want, const std::string& got) {
    throw std::runtime_error(
        fmt::format("dflash train-target: {}: expected {}, found {}", flag, want, got));
  };
  if (r.out.empty()) fail("--out", "a directory", "nothing");
  if (r.holdout.empty() || r.holdout.find('/') != std::string::npos)
    fail("--holdout", "a file name inside --corpus", "\"" + r.holdout + "\"");
  const std::pair<const char*, int64_t> positive[] = {
      {"--steps", r.steps},           {"--seq-len", r.seq_len},
      {"--batch-size", r.batch_size}, {"--hidden-size", r.hidden_size},
      {"--layers", r.num_layers},     {"--intermediate-size", r.intermediate_size}};
  for (const auto& [flag, v] : positive)
    if (v < 1) fail(flag, "a positive integer", std::to_string(v));
  if (!(r.lr > 0 && r.lr < 1)) fail("--lr", "in (0, 1)", fmt::format("{}", r.lr));
}

}  // namespace

LmResult train_byte_lm(const LmRecipe& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  check_recipe(r);
  configure_threads(r.threads);
  const Corpus corpus = read_corpus(r);
  const Config c = lm_config(r);
  TargetWeights w = make_target(c);  // N(0, init_std) matrices, unit norms, tied
  const NamedTensors params = lm_params(w);
  OptimConfig oc;
  oc.lr = r.lr, oc.beta1 = 0.9, oc.beta2 = 0.95, oc.weight_decay = r.weight_decay;
  oc.clip_norm = r.clip_norm, oc.warmup_steps = r.warmup_steps, oc.total_steps = r.steps;
  oc.min_lr_ratio = r.min_lr_ratio;
  AdamW opt(params, oc);
  std::string log = fmt::format("dflash train-target: {}\ncorpus {} (held out: {}):\n{}",
                                recipe_json(r).dump(), r.corpus, r.holdout, corpus.listing);
  const auto say = [&](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
    log += line + "\n";
  };
  double ema = 0;
  for (int64_t step = 0; step < r.steps; ++step) {
    const auto [x, y] = lm_batch(r, corpus.train, step);
    const at::Tensor h = reference::decoder_forward(c, w, x, causal_attend, nullptr);  // (B, S, H)
    const at::Tensor logits = reference::project(h, w.embed_tokens).flatten(0, 1);     // (B*S, V)
    const at::Tensor loss = at::cross_entropy_loss(logits, y);
    for (const auto& [n, p] : params) p.mutable_grad() = at::Tensor();
    loss.backward();
    const AdamW::Stats st = opt.step();
    ema = step == 0 ? loss.item<double>() : 0.95 * ema + 0.05 * loss.item<double>();
    if ((step + 1) % r.log_every == 0 || step == 0 || step + 1 == r.steps)
      say(
          fmt::format("step {:>5}  train {:.3f} bits/byte (ema)  lr {:.2e}  grad_norm {:.3f}  "
                      "{:.0f} s",
                      step + 1, ema / std::log(2.0), st.lr, st.grad_norm, seconds()));
  }
  for (const auto& [n, p] : params) p.set_requires_grad(false), p.mutable_grad() = at::Tensor();
  w.lm_head = w.embed_tokens;
  models::write_hf_model(r.out, c, w, 1);
  LmResult res = evaluate_written(r, c, corpus, say);
  res.seconds = seconds();
  say(
      fmt::format("held-out {}: {:.3f} bits/byte (unigram baseline {:.3f}); training head "
                  "{:.3f} bits/byte; {:.0f} s",
                  r.holdout, res.heldout_bpb, res.unigram_bpb, res.train_bpb, res.seconds));
  finish_directory(r, res, log);
  return res;
}

}  // namespace dflash::train
