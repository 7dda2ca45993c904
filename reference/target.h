// The frozen Qwen3-style target forward (SPEC.md "Models"), run without grad.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::reference {

struct TargetOutputs {
  at::Tensor features;      // (B, S, L*H) outputs of the tapped layers, concatenated
  at::Tensor final_hidden;  // (B, S, H) final RMSNorm output
};

// The target's causal self-attention: q (B, nh, S, hd), k/v (B, nkv, S, hd)
// -> (B, nh, S, hd), query i seeing keys j <= i.
using CausalAttentionFn =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// The forward with the attention supplied (the optimized build passes a
// query-chunked one); target_forward uses dense masked attention.
TargetOutputs target_forward_with(const Config& c, const TargetWeights& w,
                                  const at::Tensor& input_ids, const CausalAttentionFn& attend);

// The decoder itself, grad-neutral (autograd records it when the weights
// require grad: the byte LM trainer, train/lm.cpp, trains a target with it):
// the final RMSNorm output (B, S, H); `on_layer(i, x)` sees the residual
// stream after layer i. target_forward_with is this under at::NoGradGuard.
using LayerHook = std::function<void(int64_t layer, const at::Tensor& x)>;
at::Tensor decoder_forward(const Config& c, const TargetWeights& w, const at::Tensor& input_ids,
                           const CausalAttentionFn& attend, const LayerHook& on_layer);

// Dense causal attention (query i sees keys j <= i) through masked_attention:
// what target_forward attends with.
at::Tensor dense_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Runs under at::NoGradGuard. "The output of layer i" is the residual stream
// after layer i (Hugging Face hidden_states[i + 1]).
TargetOutputs target_forward(const Config& c, const TargetWeights& w,
                             const at::Tensor& input_ids);  // (B, S) int64

// Target logits for the final hidden states: (B, S, V).
at::Tensor target_logits(const TargetWeights& w, const at::Tensor& final_hidden);

}  // namespace dflash::reference
