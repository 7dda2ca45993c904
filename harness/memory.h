// The formula library: analytic memory of each part of a drafter step. The
// memory ceilings (harness/memory_test.cpp, the zoo) and the planner
// (harness/planner.h) use these same functions, and the calibration test
// holds them to the allocator probe's measurements (docs/PREFLIGHT.md).
//
// Sizes in bytes. e = compute element size (2 bf16, 4 fp32, 8 fp64), a =
// accumulation size (4, or 8 for fp64). Coefficients were fitted on CPU in
// float32 and are exact counts where the code makes them so.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "optimized/kernels.h"

namespace dflash::harness {

struct Formula {
  double bytes;
  std::string text;  // the formula, for reports
};

// Fused chunked loss over M weighted rows (Ns student rows), chunk C:
//   forward  NsHe + (1+kl)CVe + (2+kl)CHe + 56M + rows; backward 2NsHe; the max.
// rows is the row work's own working set: 0 for the host kernels (in place);
// for the ATen twin (optimized/aten_rows.h) CV(up + a) without the KL and
// CV(up + 3a + 1) with it (fp32 temporaries, up = a when e < a for the
// upcast student logits, 1 byte for the p_t = 0 mask).
Formula chunked_loss_bytes(int64_t M, int64_t Ns, int64_t H, int64_t V, int64_t C, bool kl,
                           int64_t e, optimized::Kernels kernels = optimized::Kernels::kHost);
// Plain autograd per chunk (no recomputation): every chunk's logits and, in
// fp32, (1 + 2kl) copies of them stay alive until backward, plus the current
// chunk's transients; the peak is the max over chunks i of
//   V (e + up + 8kl) (rows through chunk i) + 4 V (3 + 2kl) n_i,
// up = 4 when e < 4 (the fp32 upcast of low-precision logits).
Formula chunked_no_recompute_loss_bytes(int64_t Q, int64_t V, int64_t C, bool kl, int64_t e);
// The reference's full logits: (5 + 2kl) fp32 copies of (Q, V), plus the
// low-precision logits when e < 4.
Formula unchunked_loss_bytes(int64_t Q, int64_t V, bool kl, int64_t e);

// Block-sparse attention, forward + backward, per call. R = (nh/nkv) Q.
//   e(2 B nh Q hd + 2 B nkv (S+Q) hd) + a B nh Q + (3e+3a) R hd + 2a (S+Q) hd
//   + 2a R min(T, S+Q), plus a B nh Q hd (the acc-precision output) when e < a,
//   plus R min(T, S+Q) (the tile's visibility mask) for the ATen twin.
Formula sparse_attention_bytes(int64_t B, int64_t nh, int64_t nkv, int64_t Q, int64_t S, int64_t hd,
                               int64_t T, int64_t e, int64_t a,
                               optimized::Kernels kernels = optimized::Kernels::kHost);
// Dense masked attention: the (B, nh, Q, S+Q) fp32 score matrix; per layer
// autograd keeps about 2.4 copies of it (scores, softmax, masked probs) and,
// with GQA, K and V repeated to every query head. dense_attention_saved_bytes
// is what a layer keeps beyond the sparse path's saved tensors.
Formula dense_scores_one_copy(int64_t B, int64_t nh, int64_t Q, int64_t S);
Formula dense_attention_saved_bytes(int64_t B, int64_t nh, int64_t nkv, int64_t Q, int64_t S,
                                    int64_t hd, int64_t e);

// Activations one drafter layer keeps for backward without checkpointing:
//   e(6.5 BQH + 6 BQ nh hd + 2.2 BQI + 0.5 B(S+Q)H + 5 B(S+Q) nkv hd)
// (coefficients fitted against libtorch 2.11's autograd; harness.Sweep/Calibration)
Formula layer_activation_bytes(int64_t B, int64_t Q, int64_t S, const LayerShape& s, int64_t e);
// The MLP and post-attention norm's share of a layer's activations,
// e(2.2 BQI + 2 BQH): freed by the layer's backward before its attention
// backward runs, so never alive together with the attention working set.
Formula mlp_share_bytes(int64_t B, int64_t Q, int64_t H, int64_t I, int64_t e);
// What a checkpointed drafter forward keeps: every layer's input and the
// output, the embeddings and the final norm's input ((layers + 3) BQHe), and
// the keys' RoPE tables (2 B (S+Q) hd e). The context is counted apart.
Formula checkpointed_saved_bytes(int64_t layers, int64_t B, int64_t Q, int64_t S, int64_t H,
                                 int64_t hd, int64_t e);
// The context projection and its RMSNorm, saved for backward: 3 BSHe.
Formula context_bytes(int64_t B, int64_t S, int64_t H, int64_t e);

// Parameter counts (elements).
int64_t layer_param_count(const LayerShape& s);
int64_t drafter_param_count(const Config& c);
int64_t target_param_count(const Config& c);  // embed + layers + norm + LM head (once if tied)

}  // namespace dflash::harness
