// KV-cached greedy decoding over the reference building blocks.
#include "models/generate.h"

#include "reference/layers.h"

namespace dflash::models {
namespace {

using namespace dflash::reference;

struct LayerCache {
  at::Tensor k, v;  // (B, nkv, T, hd), grown by one position per new token
};

// One decoder layer over new positions `x` (B, T, H) at absolute positions
// [t0, t0 + T), attending to the cache plus themselves (causal).
at::Tensor cached_layer(const at::Tensor& x, const DecoderLayerWeights& w, const LayerShape& s,
                        LayerCache& cache, int64_t t0) {
  const int64_t B = x.size(0), T = x.size(1), hd = s.head_dim;
  const double eps = s.rms_norm_eps;
  const at::Tensor pos = at::arange(t0, t0 + T, x.options().dtype(at::kLong)).expand({B, T});
  auto [cos, sin] = rope_cos_sin(pos, hd, s.rope_theta, x.scalar_type());
  cos = cos.unsqueeze(1), sin = sin.unsqueeze(1);  // (B, 1, T, hd)
  const at::Tensor h = rms_norm(x, w.input_layernorm, eps);
  const at::Tensor q =
      apply_rope(normed_heads(h, w.q_proj, w.q_norm, s.num_attention_heads, hd, eps), cos, sin);
  const at::Tensor k =
      apply_rope(normed_heads(h, w.k_proj, w.k_norm, s.num_key_value_heads, hd, eps), cos, sin);
  const at::Tensor v = split_heads(project(h, w.v_proj), s.num_key_value_heads, hd);
  cache.k = cache.k.defined() ? at::cat({cache.k, k}, 2) : k;  // (B, nkv, t0 + T, hd)
  cache.v = cache.v.defined() ? at::cat({cache.v, v}, 2) : v;
  // Query i (absolute t0 + i) sees keys j <= t0 + i.
  const at::Tensor visible =
      at::ones({T, t0 + T}, x.options().dtype(at::kBool)).tril(t0).expand({B, T, t0 + T});
  const at::Tensor attn = masked_attention(q, cache.k, cache.v, visible);  // (B, nh, T, hd)
  const at::Tensor x1 = x + project(merge_heads(attn), w.o_proj);
  return x1 + swiglu_mlp(rms_norm(x1, w.post_attention_layernorm, eps), w);
}

// Runs positions [t0, t0 + T) of `tokens` (B, T) through every layer and
// returns the last position's next-token choice (B).
at::Tensor step(const Config& c, const TargetWeights& w, std::vector<LayerCache>& caches,
                const at::Tensor& tokens, int64_t t0, int64_t banned) {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  at::Tensor x = w.embed_tokens.index_select(0, tokens.reshape(-1)).view({B, T, -1});
  for (size_t l = 0; l < w.layers.size(); ++l)
    x = cached_layer(x, w.layers[l], c.target.shape, caches[l], t0);
  const at::Tensor last = rms_norm(x.select(1, T - 1), w.norm, c.target.shape.rms_norm_eps);
  at::Tensor logits = project(last, w.lm_head).to(at::kFloat);  // (B, V)
  logits.select(1, banned).fill_(-INFINITY);
  return logits.argmax(1);
}

}  // namespace

void greedy_continue(const Config& c, const TargetWeights& target, at::Tensor& ids_out,
                     int64_t prompt_len, int64_t banned_token) {
  at::NoGradGuard ng;
  // Decoded on the target's device; the tokens come back to ids_out's.
  at::Tensor ids = ids_out.to(target.embed_tokens.device());
  const int64_t S = ids.size(1);
  std::vector<LayerCache> caches(target.layers.size());
  at::Tensor next =
      step(c, target, caches, ids.narrow(1, 0, prompt_len).contiguous(), 0, banned_token);
  for (int64_t t = prompt_len; t < S; ++t) {
    ids.select(1, t).copy_(next);
    if (t + 1 < S)
      next = step(c, target, caches, ids.narrow(1, t, 1).contiguous(), t, banned_token);
  }
  if (!ids.is_same(ids_out)) ids_out.copy_(ids);
}

}  // namespace dflash::models
