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

// What the loss computes, as far as its memory goes (docs/LOSSES.md): the
// teacher's logits exist when any distillation term is on; reverse KL, TV
// and JSD at 0 < beta need the student's probabilities beside the
// teacher's (the ATen twin's general path); JSD at 0 < beta < 1 the
// mixture log m. From a bool: CE alone (false) or CE + forward KL (true).
struct LossTerms {
  bool teacher = false;
  bool student_probs = false;
  bool mixture = false;
  int distill_terms = 0;    // how many of kl, reverse_kl, jsd, tv are on
  int aten_row_slices = 1;  // optimized::aten_row_slices: the ATen rows run a chunk in this many
  LossTerms(bool kl = false) : teacher(kl), distill_terms(kl ? 1 : 0) {}  // NOLINT
  static LossTerms of(const LossConfig& loss);
  std::string text() const;  // "ce+kl", "ce+jsd(mixture)+tv", ...
};

// Fused chunked loss over M weighted rows (Ns student rows), chunk C:
//   forward  NsHe + (1+t)CVe + (2+t)CHe + 56M + rows; backward 2NsHe; the max
// (t = 1 with a teacher). rows is the row work's own working set: 0 for the
// host kernels (in place, every objective); for the ATen twin
// (optimized/aten_rows.h) CV(up + a) for CE alone, CV(up + 3a + 1) with the
// forward KL, CV(up + 4a) on the general path and CV(up + 5a)/2 with the
// JSD mixture (two row slices) (fp32 temporaries, up = a when e < a for
// the upcast student logits, bytes for the masks); measured,
// harness/memory_test.cpp.
// The sizes of one fused loss call.
struct LossSizes {
  int64_t M = 0;   // weighted rows
  int64_t Ns = 0;  // student rows (the hidden states it reads)
  int64_t H = 0, V = 0;
  int64_t C = 0;  // chunk rows
};
Formula chunked_loss_bytes(const LossSizes& z, const LossTerms& terms, int64_t e,
                           optimized::Kernels kernels = optimized::Kernels::kHost);
// Plain autograd per chunk (no recomputation): every chunk's logits and, in
// fp32, the arrays autograd saves for the terms stay alive until backward,
// plus the current chunk's transients; the peak is the max over chunks i of
//   V (e + up + s) (rows through chunk i) + 4 V (3 + x) n_i,
// up = 4 when e < 4 (the fp32 upcast of low-precision logits); s and x, the
// saved and transient bytes per element of the terms, are in the .cpp.
Formula chunked_no_recompute_loss_bytes(int64_t Q, int64_t V, int64_t C, const LossTerms& terms,
                                        int64_t e);
// The reference's full logits: 4QV(5 + 2t + p + 7m + (terms - 1)) fp32
// copies of (Q, V) (t teacher, p the student's probabilities, m the JSD
// mixture), plus the low-precision logits when e < 4.
Formula unchunked_loss_bytes(int64_t Q, int64_t V, const LossTerms& terms, int64_t e);

// The sizes of one attention: B sequences, nh query heads over nkv
// key/value heads of hd, Q query rows and S positions before them (the
// drafter's keys are the S context positions and the Q block positions; the
// target's are S positions, read Q query rows at a time).
struct AttentionSizes {
  int64_t B = 1, nh = 1, nkv = 1, Q = 0, S = 0, hd = 0;
  // A layer of shape `s`: B rows, Q queries, S positions.
  static AttentionSizes of(const LayerShape& s, int64_t B, int64_t Q, int64_t S);
};

// Block-sparse attention, forward + backward, per call. R = (nh/nkv) Q.
//   e(2 B nh Q hd + 2 B nkv (S+Q) hd) + a B nh Q + (3e+3a) R hd + 2a (S+Q) hd
//   + 2a R min(T, S+Q), plus a B nh Q hd (the acc-precision output) when e < a,
//   plus R min(T, S+Q) (the tile's visibility mask) for the ATen twin.
// T the key tile, e and a the bytes per element of the inputs and of the
// accumulation.
Formula sparse_attention_bytes(const AttentionSizes& z, int64_t T, int64_t e, int64_t a,
                               optimized::Kernels kernels = optimized::Kernels::kHost);
// Dense masked attention: the (B, nh, Q, S+Q) fp32 score matrix; per layer
// autograd keeps about 2.4 copies of it (scores, softmax, masked probs) and,
// with GQA, K and V repeated to every query head. dense_attention_saved_bytes
// is what a layer keeps beyond the sparse path's saved tensors.
Formula dense_scores_one_copy(int64_t B, int64_t nh, int64_t Q, int64_t S);

// One layer of dflash's own target attention (no grad) over z.S positions,
// z.Q query rows at a time (Q >= S: dense, reference::target_forward; Q < S:
// optimized::target_forward), e bytes per element of q, k, v.
Formula target_attention_bytes(const AttentionSizes& z, int64_t e);
Formula dense_attention_saved_bytes(const AttentionSizes& z, int64_t e);

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
Formula checkpointed_saved_bytes(int64_t layers, const AttentionSizes& z, int64_t H, int64_t e);
// The context projection and its RMSNorm, saved for backward: 3 BSHe.
Formula context_bytes(int64_t B, int64_t S, int64_t H, int64_t e);

// Parameter counts (elements).
int64_t layer_param_count(const LayerShape& s);
int64_t drafter_param_count(const Config& c);
int64_t target_param_count(const Config& c);  // embed + layers + norm + LM head (once if tied)

}  // namespace dflash::harness
