// Shared by the speculative decoding tests (quick and nightly): generated
// decoding cases and an oracle drafter that drafts the target's own greedy
// text with seeded errors, so every accept length is reached.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <vector>

#include "core/batch.h"
#include "decode/speculative.h"
#include "harness/generators.h"

namespace dflash::decode::testing {

struct DecodeCase {
  Config c;  // float64: argmax ties are out of reach of summation-order noise
  std::vector<int64_t> prompt;
  DecodeOptions o;
  uint64_t seed = 0;
};

inline void showValue(const DecodeCase& k, std::ostream& os) {
  os << config_to_toml(k.c) << "prompt:";
  for (int64_t t : k.prompt) os << " " << t;
  os << "\nblock_size " << k.o.block_size << " max_new_tokens " << k.o.max_new_tokens
     << " max_context " << k.o.max_context << " banned " << k.o.banned_token << " stop "
     << k.o.stop_token << " tree_budget " << k.o.tree_budget << " seed " << k.seed << "\n";
}

// Prompts of 1..max_prompt tokens, block sizes 2..8, lengths 0..max_new and
// context limits from the prompt's own length (nothing to generate) to past
// prompt + length, a stop token now and then.
inline rc::Gen<DecodeCase> gen_decode_case(int64_t max_prompt = 10, int64_t max_new = 24) {
  return rc::gen::exec([=] {
    DecodeCase k;
    k.c = *harness::gen_micro_config();
    const int64_t V = k.c.target.vocab_size;
    k.prompt = *rc::gen::container<std::vector<int64_t>>(
        size_t(*rc::gen::inRange<int64_t>(1, max_prompt + 1)), rc::gen::inRange<int64_t>(0, V));
    k.o.block_size = *rc::gen::inRange<int64_t>(2, 9);
    k.o.max_new_tokens = *rc::gen::inRange<int64_t>(0, max_new + 1);
    k.o.max_context =
        int64_t(k.prompt.size()) + *rc::gen::inRange<int64_t>(0, k.o.max_new_tokens + 4);
    k.o.banned_token = k.c.data.mask_token_id;
    k.o.stop_token = *rc::gen::weightedOneOf<int64_t>(
        {{3, rc::gen::just<int64_t>(-1)}, {1, rc::gen::inRange<int64_t>(0, V)}});
    k.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    return k;
  });
}

// A fixed float64 config for the unit cases.
inline Config small_config() {
  Config c;
  c.path = "<small>";
  c.target.vocab_size = 24, c.target.num_hidden_layers = 2;
  LayerShape layer;  // rms_norm_eps: the default (1e-6)
  layer.hidden_size = 16, layer.intermediate_size = 24, layer.head_dim = 4;
  layer.num_attention_heads = 4, layer.num_key_value_heads = 2;
  layer.rope_theta = 1e4;
  c.target.shape = layer;
  c.target.init_std = 0.2, c.target.norm_init_jitter = 0.1;
  c.drafter.num_hidden_layers = 1, c.drafter.shape = c.target.shape;
  c.drafter.target_layer_ids = {0, 1};
  c.drafter.allow_last_layer_tap = true;
  c.drafter.init_std = 0.2;
  c.data.batch_size = 1, c.data.seq_len = 16, c.data.block_size = 4, c.data.max_anchors = 2;
  c.data.mask_token_id = 23;
  c.run.dtype = DType::kFloat64, c.run.seed = 7;
  validate_config(c);
  return c;
}

// Drafts the greedy text `truth` (the tokens after a prompt of `prompt_len`)
// with one seeded error per round at a uniform slot (or none). With
// `second_rank` the true token is ranked second where the error is, so a
// tree of budget >= 2 can recover it. Records, per proposal, how many
// leading proposed tokens agree with the truth (a stop token ends the count).
class OracleDrafter : public Drafter {
 public:
  OracleDrafter(std::vector<int64_t> truth, int64_t prompt_len, int64_t vocab, uint64_t seed,
                double second_rank, int64_t stop = -1)
      : truth_(std::move(truth)),
        P_(prompt_len),
        V_(vocab),
        seed_(seed),
        second_(second_rank),
        stop_(stop) {}
  void extend(const at::Tensor& taps) override { length_ += taps.size(0); }
  int64_t context_length() const override { return length_; }
  at::Tensor propose(int64_t, int64_t slots) override {
    Rng rng(seed_ * 1000003u + uint64_t(length_));
    const int64_t bad = 1 + int64_t(rng.below(uint64_t(slots + 1)));  // slots + 1: none
    at::Tensor logits = at::empty({slots, V_}, at::kDouble);          // (slots, V)
    for (int64_t j = 0; j < slots; ++j)
      for (int64_t v = 0; v < V_; ++v) logits[j][v] = rng.uniform();
    int64_t agree = 0;
    bool leading = true, recoverable = false;
    for (int64_t j = 1; j <= slots; ++j) {
      const int64_t i = length_ + j - P_;  // index into truth of position anchor + j
      const int64_t want = i < int64_t(truth_.size()) ? truth_[size_t(i)] : -1;
      int64_t prop = want >= 0 && j < bad ? want : int64_t(rng.below(uint64_t(V_)));
      if (j == bad && prop == want) prop = (want + 1) % V_;
      logits[j - 1][prop] += 10.0;
      if (j == bad && want >= 0 && second_ > 0) logits[j - 1][want] += 5.0;
      recoverable = recoverable || (j == bad && leading && want >= 0 && second_ > 0);
      leading = leading && want >= 0 && prop == want;
      agree += leading;
      leading = leading && want != stop_;
    }
    expected_.push_back(agree);
    recoverable_.push_back(recoverable);
    return at::log_softmax(logits, -1);
  }
  const std::vector<int64_t>& expected_accepts() const { return expected_; }
  // Per proposal: the error slot follows an agreeing prefix and ranks the
  // true token second, so a tree holding that sibling accepts one more.
  const std::vector<bool>& recoverable() const { return recoverable_; }

 private:
  std::vector<int64_t> truth_;
  int64_t P_, V_;
  uint64_t seed_;
  double second_;
  int64_t stop_;
  int64_t length_ = 0;
  std::vector<int64_t> expected_;
  std::vector<bool> recoverable_;
};

// Records the target states a decoder hands its drafter, in order.
class RecordingDrafter : public Drafter {
 public:
  explicit RecordingDrafter(Drafter& inner) : inner_(inner) {}
  void extend(const at::Tensor& taps) override {
    taps_.push_back(taps.clone());
    inner_.extend(taps);
  }
  at::Tensor propose(int64_t anchor, int64_t slots) override {
    return inner_.propose(anchor, slots);
  }
  int64_t context_length() const override { return inner_.context_length(); }
  at::Tensor taps() const { return taps_.empty() ? at::Tensor() : at::cat(taps_, 0); }

 private:
  Drafter& inner_;
  std::vector<at::Tensor> taps_;
};

// Accepted counts of the rounds that asked the drafter (slots > 0).
inline std::vector<int64_t> drafted_accepts(const DecodeResult& r) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < r.accepted.size(); ++i)
    if (r.slots[i] > 0) out.push_back(r.accepted[i]);
  return out;
}

}  // namespace dflash::decode::testing
