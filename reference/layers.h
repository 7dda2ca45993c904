// Building blocks of a Qwen3-style decoder, written to be read (SPEC.md
// "Numerical conventions"). Both the target forward and the drafter use them;
// the optimized build reuses the ones it does not replace.
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::reference {

// y = weight * (x * rsqrt(mean(x^2, -1) + eps)), the normalisation in fp32
// (or fp64) even for bf16 inputs, cast back before the weight, as in HF Qwen3.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// cos/sin tables for RoPE at integer positions: (..., hd) from positions (...),
// angles computed in float64 (more exact than HF's fp32 angles at long
// contexts; see docs/SPEC_MAP.md), then cast to `dtype`. Frequencies
// theta^(-2i/hd), rescaled by s.rope_scaling (llama3) when it has a type.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& positions, const LayerShape& s,
                                               at::ScalarType dtype);

// q' = q*cos + rotate_half(q)*sin; x (B, heads, T, hd), cos/sin (B, 1, T, hd).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// down_proj(silu(gate_proj(x)) * up_proj(x)).
at::Tensor swiglu_mlp(const at::Tensor& x, const DecoderLayerWeights& w);

// Dense masked attention with GQA (query head h reads kv head h div (nh/nkv)).
// q (B, nh, Tq, hd), k/v (B, nkv, Tk, hd), visible (B, Tq, Tk) bool. Softmax
// accumulates in at least fp32; a query row that sees no key outputs exactly 0.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& visible);

// Per-head query or key: proj(x) split into heads, RMSNorm over hd with
// `norm` (q_norm / k_norm; an undefined norm, a Llama target's, is none),
// laid out (B, heads, T, hd). RoPE is applied after.
at::Tensor normed_heads(const at::Tensor& x, const at::Tensor& proj, const at::Tensor& norm,
                        int64_t heads, int64_t head_dim, double eps);

// (B, T, heads*hd) -> (B, heads, T, hd) and back.
at::Tensor split_heads(const at::Tensor& x, int64_t heads, int64_t head_dim);
at::Tensor merge_heads(const at::Tensor& x);

// x @ w^T for a Linear weight (out, in).
inline at::Tensor project(const at::Tensor& x, const at::Tensor& w) { return at::matmul(x, w.t()); }

}  // namespace dflash::reference
