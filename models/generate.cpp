// The target's key/value-cached forward over the reference building blocks;
// see generate.h.
#include "models/generate.h"

#include "reference/layers.h"

namespace dflash::models {
namespace {

using namespace dflash::reference;

// Committed keys (all visible) beside the new rows' own visibility: (1, T, n + T).
at::Tensor visibility(int64_t committed, const at::Tensor& among_new) {
  const int64_t T = among_new.size(0);
  const at::Tensor old = at::ones({T, committed}, among_new.options());
  return at::cat({old, among_new}, 1).unsqueeze(0);
}

}  // namespace

Rope rope_at(const at::Tensor& positions, const LayerShape& s,
             at::ScalarType dtype) {  // (T) or (B, T)
  auto [cos, sin] =
      rope_cos_sin(positions.dim() == 1 ? positions.unsqueeze(0) : positions, s, dtype);
  return {cos.unsqueeze(1), sin.unsqueeze(1)};
}

at::Tensor cat_keys(const at::Tensor& cache, const at::Tensor& fresh) {  // along positions
  return cache.defined() ? at::cat({cache, fresh}, 2) : fresh;
}

std::vector<int64_t> iota_rows(int64_t n) {
  std::vector<int64_t> r(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = i;
  return r;
}

TargetCache::TargetCache(const Config& c, const TargetWeights& w, int64_t banned)
    : c_(c), w_(w), banned_(banned), k_(w.layers.size()), v_(w.layers.size()) {}

TargetCache::Out TargetCache::forward(const at::Tensor& tokens, const at::Tensor& positions,
                                      const at::Tensor& visible, int64_t choices_from,
                                      const at::Tensor& real) {
  at::NoGradGuard ng;
  const LayerShape& s = c_.target.shape;
  const int64_t B = tokens.size(0), T = tokens.size(1), hd = s.head_dim;
  const double eps = s.rms_norm_eps;
  const auto dev = w_.embed_tokens.device();
  at::Tensor x =
      w_.embed_tokens.index_select(0, tokens.to(dev).reshape(-1)).view({B, T, -1});  // (B, T, H)
  const Rope r = rope_at(positions.to(dev), s, x.scalar_type());
  const at::Tensor among =
      visible.defined() ? visible.to(dev) : at::ones({T, T}, x.options().dtype(at::kBool)).tril();
  at::Tensor mask = visibility(length_, among);  // (1, T, length + T)
  pending_real_ = real.defined() ? real.to(dev).to(at::kBool) : at::Tensor();
  if (real_.defined() || real.defined()) {  // padding is never a key: (B, T, length + T)
    const auto all = [&](int64_t n) { return at::ones({B, n}, x.options().dtype(at::kBool)); };
    if (!pending_real_.defined()) pending_real_ = all(T);
    const at::Tensor keys = at::cat({real_.defined() ? real_ : all(length_), pending_real_}, 1);
    mask = mask & keys.unsqueeze(1);
  }
  std::vector<at::Tensor> taps(c_.drafter.target_layer_ids.size());
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w_.layers[l];
    if (k_[l].defined() && k_[l].size(2) > length_)  // an uncommitted forward's keys
      k_[l] = k_[l].narrow(2, 0, length_), v_[l] = v_[l].narrow(2, 0, length_);
    const at::Tensor h = rms_norm(x, lw.input_layernorm, eps);  // (B, T, H)
    const at::Tensor q =
        apply_rope(normed_heads(h, lw.q_proj, lw.q_norm, s.num_attention_heads, hd, eps), r.cos,
                   r.sin);  // (B, nh, T, hd)
    const at::Tensor k = apply_rope(
        normed_heads(h, lw.k_proj, lw.k_norm, s.num_key_value_heads, hd, eps), r.cos, r.sin);
    k_[l] = cat_keys(k_[l], k);  // (B, nkv, length + T, hd)
    v_[l] = cat_keys(v_[l], split_heads(project(h, lw.v_proj), s.num_key_value_heads, hd));
    const at::Tensor x1 =
        x + project(merge_heads(masked_attention(q, k_[l], v_[l], mask)), lw.o_proj);
    x = x1 + swiglu_mlp(rms_norm(x1, lw.post_attention_layernorm, eps), lw);
    for (size_t t = 0; t < taps.size(); ++t)
      if (c_.drafter.target_layer_ids[t] == int64_t(l)) taps[t] = x;
  }
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor last = x.narrow(1, choices_from, T - choices_from);
  at::Tensor logits = project(rms_norm(last, w_.norm, eps), w_.lm_head).to(acc);
  if (banned_ >= 0) logits.select(2, banned_).fill_(-INFINITY);  // (B, T - choices_from, V)
  return {logits.argmax(2), taps.empty() ? at::Tensor() : at::cat(taps, -1)};
}

void TargetCache::commit(const std::vector<int64_t>& rows) {
  if (rows.empty()) return;
  for (size_t l = 0; l < k_.size(); ++l) {
    const at::Tensor idx = at::tensor(rows, at::kLong).to(k_[l].device()) + length_;
    const at::Tensor keep = at::cat({at::arange(length_, idx.options()), idx});
    k_[l] = k_[l].index_select(2, keep), v_[l] = v_[l].index_select(2, keep);
  }
  if (pending_real_.defined()) {
    const at::Tensor idx = at::tensor(rows, at::kLong).to(pending_real_.device());
    const at::Tensor kept = pending_real_.index_select(1, idx);
    real_ = real_.defined() ? at::cat({real_, kept}, 1)
                            : at::cat({at::ones({kept.size(0), length_}, kept.options()), kept}, 1);
  }
  length_ += int64_t(rows.size());
}

void greedy_continue(const Config& c, const TargetWeights& target, at::Tensor& ids_out,
                     int64_t prompt_len, int64_t banned_token) {
  // Decoded on the target's device; the tokens come back to ids_out's.
  at::Tensor ids = ids_out.to(target.embed_tokens.device());
  const int64_t S = ids.size(1);
  const at::TensorOptions idx = ids.options().dtype(at::kLong);
  TargetCache tc(c, target, banned_token);
  at::Tensor next = tc.forward(ids.narrow(1, 0, prompt_len), at::arange(prompt_len, idx), {},
                               prompt_len - 1)
                        .choice;  // (B, 1)
  tc.commit(iota_rows(prompt_len));
  for (int64_t t = prompt_len; t < S; ++t) {
    ids.narrow(1, t, 1).copy_(next);
    if (t + 1 == S) break;
    next = tc.forward(ids.narrow(1, t, 1), at::arange(t, t + 1, idx), {}).choice;
    tc.commit({0});
  }
  if (!ids.is_same(ids_out)) ids_out.copy_(ids);
}

namespace {

// One conversation of greedy_answers: its original tokens and the row it
// becomes.
struct Answering {
  const int64_t* in;
  const bool* m;
  int64_t S, i = 0;  // the original row, and the next of its tokens to take
  std::vector<int64_t> out;
  std::vector<uint8_t> answer;
  int64_t fed = 0;    // tokens of `out` in the cache
  int64_t eot = -1;   // >= 0 while an answer is being generated
  bool done = false;  // the row is full or the conversation over

  // Takes prompt tokens up to the next answer (an answer with nothing before
  // it stays as it is), then either starts answering or ends the row.
  void advance() {
    while (eot < 0 && !done) {
      while (i < S && !m[i] && int64_t(out.size()) < S) out.push_back(in[i++]), answer.push_back(0);
      if (i >= S || int64_t(out.size()) >= S) {
        done = true;
        return;
      }
      int64_t b = i;
      while (b < S && m[b]) ++b;
      if (out.empty()) {
        for (; i < b; ++i) out.push_back(in[i]), answer.push_back(1);
        continue;
      }
      eot = in[b - 1];  // the template's end-of-turn token closes the turn
      i = b;
    }
  }
  // The greedy token after `out`: the answer goes on, or ends the turn.
  void take(int64_t t) {
    out.push_back(t), answer.push_back(1);
    if (t == eot) eot = -1;
    if (int64_t(out.size()) >= S) done = true, eot = -1;
    advance();
  }
};

}  // namespace

void greedy_answers(const Config& c, const TargetWeights& target, at::Tensor& ids, at::Tensor& mask,
                    int64_t banned_token) {
  const int64_t N = ids.size(0), S = ids.size(1);
  const at::Tensor ic = ids.to(at::kLong).contiguous(), mc = mask.to(at::kBool).contiguous();
  std::vector<Answering> rows;
  for (int64_t r = 0; r < N; ++r) {
    rows.push_back({ic.data_ptr<int64_t>() + r * S, mc.data_ptr<bool>() + r * S, S});
    rows.back().advance();
  }
  const auto dev = target.embed_tokens.device();
  TargetCache tc(c, target, banned_token);
  for (;;) {
    int64_t T = 0;  // the longest feed: a row's tokens not yet in the cache
    for (const Answering& a : rows)
      if (a.eot >= 0) T = std::max<int64_t>(T, int64_t(a.out.size()) - a.fed);
    if (T == 0) break;
    at::Tensor tok = at::zeros({N, T}, at::kLong), pos = at::zeros({N, T}, at::kLong);
    at::Tensor real = at::zeros({N, T}, at::kBool);
    for (int64_t r = 0; r < N; ++r) {  // right-aligned: every row's last token at T - 1
      const Answering& a = rows[size_t(r)];
      const int64_t n = a.eot >= 0 ? int64_t(a.out.size()) - a.fed : 0;
      for (int64_t j = 0; j < n; ++j) {
        tok[r][T - n + j] = a.out[size_t(a.fed + j)];
        pos[r][T - n + j] = a.fed + j;
        real[r][T - n + j] = true;
      }
    }
    const at::Tensor choice =
        tc.forward(tok.to(dev), pos.to(dev), {}, T - 1, real.to(dev)).choice.to(at::kCPU);
    tc.commit(iota_rows(T));
    for (int64_t r = 0; r < N; ++r) {
      Answering& a = rows[size_t(r)];
      if (a.eot < 0) continue;
      a.fed = int64_t(a.out.size());
      a.take(choice[r][0].item<int64_t>());
    }
  }
  ids.zero_(), mask.zero_();
  for (int64_t r = 0; r < N; ++r)
    for (size_t k = 0; k < rows[size_t(r)].out.size(); ++k)
      ids[r][int64_t(k)] = rows[size_t(r)].out[k],
      mask[r][int64_t(k)] = bool(rows[size_t(r)].answer[k]);
}

}  // namespace dflash::models
