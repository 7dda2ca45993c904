#include "reference/target.h"

#include "reference/layers.h"

namespace dflash::reference {
namespace {

// One causal decoder layer over the whole sequence; x (B, S, H).
at::Tensor target_layer(const at::Tensor& x, const DecoderLayerWeights& w, const LayerShape& s,
                        const at::Tensor& cos, const at::Tensor& sin,
                        const CausalAttentionFn& attend) {
  const int64_t hd = s.head_dim;
  const int64_t nh = s.num_attention_heads, nkv = s.num_key_value_heads;
  const at::Tensor h = rms_norm(x, w.input_layernorm, s.rms_norm_eps);  // (B, S, H)
  const double eps = s.rms_norm_eps;
  const at::Tensor q = apply_rope(normed_heads(h, w.q_proj, w.q_norm, nh, hd, eps), cos, sin);
  const at::Tensor k = apply_rope(normed_heads(h, w.k_proj, w.k_norm, nkv, hd, eps), cos, sin);
  const at::Tensor v = split_heads(project(h, w.v_proj), nkv, hd);  // (B, nkv, S, hd)
  const at::Tensor attn = attend(q, k, v);                          // (B, nh, S, hd)
  const at::Tensor x1 = x + project(merge_heads(attn), w.o_proj);
  return x1 + swiglu_mlp(rms_norm(x1, w.post_attention_layernorm, s.rms_norm_eps), w);
}

}  // namespace

at::Tensor dense_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t B = q.size(0), S = q.size(2);
  const at::Tensor causal =
      at::ones({S, S}, q.options().dtype(at::kBool)).tril().expand({B, S, S});  // (B, S, S)
  return masked_attention(q, k, v, causal);
}

TargetOutputs target_forward(const Config& c, const TargetWeights& w, const at::Tensor& input_ids) {
  return target_forward_with(c, w, input_ids, dense_causal_attention);
}

at::Tensor decoder_forward(const Config& c, const TargetWeights& w, const at::Tensor& input_ids,
                           const CausalAttentionFn& attend, const LayerHook& on_layer) {
  const LayerShape& s = c.target.shape;
  const int64_t B = input_ids.size(0), S = input_ids.size(1);
  at::Tensor x = w.embed_tokens.index_select(0, input_ids.reshape(-1)).view({B, S, -1});
  const at::Tensor pos = at::arange(S, input_ids.options()).expand({B, S});  // (B, S)
  auto [cos, sin] = rope_cos_sin(pos, s, x.scalar_type());
  cos = cos.unsqueeze(1);  // (B, 1, S, hd)
  sin = sin.unsqueeze(1);
  for (int64_t i = 0; i < c.target.num_hidden_layers; ++i) {
    x = target_layer(x, w.layers[size_t(i)], s, cos, sin, attend);
    if (on_layer) on_layer(i, x);
  }
  return rms_norm(x, w.norm, s.rms_norm_eps);
}

TargetOutputs target_forward_with(const Config& c, const TargetWeights& w,
                                  const at::Tensor& input_ids, const CausalAttentionFn& attend) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> taps(c.drafter.target_layer_ids.size());
  at::Tensor final_hidden =
      decoder_forward(c, w, input_ids, attend, [&](int64_t i, const at::Tensor& x) {
        for (size_t t = 0; t < taps.size(); ++t)
          if (c.drafter.target_layer_ids[t] == i) taps[t] = x;
      });
  return {at::cat(taps, -1), final_hidden};
}

at::Tensor target_logits(const TargetWeights& w, const at::Tensor& final_hidden) {
  at::NoGradGuard no_grad;
  return project(final_hidden, w.lm_head);
}

}  // namespace dflash::reference
