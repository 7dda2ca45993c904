// The reference DFlash drafter step (SPEC.md "One step"): dense masked
// attention, full logits, plain autograd. It is the spec in code.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "core/batch.h"
#include "core/step.h"

namespace dflash::reference {

// SPEC step 7 as an explicit boolean tensor: (B, Q, S+Q), true where draft
// slot q = n*bs + k may attend key j.
at::Tensor build_draft_mask(const Anchors& a, int64_t seq_len, int64_t block_size);

// Draft attention: q (B, nh, Q, hd), k/v (B, nkv, S+Q, hd) -> (B, nh, Q, hd),
// dense, through build_draft_mask. optimized::draft_attention is its twin.
at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t seq_len, int64_t block_size);

// RoPE tables of a step (SPEC step 5): keys at 0..S-1 then anchor_n + k.
struct DraftRope {
  at::Tensor cos_q, sin_q;  // (B, 1, Q, hd)
  at::Tensor cos_k, sin_k;  // (B, 1, S+Q, hd)
};
DraftRope draft_rope(int64_t seq_len, const at::Tensor& positions,  // (B, Q)
                     const LayerShape& s, at::ScalarType dtype);

// Step 3: x = embed(noise_ids), (B, Q, H). Step 4: C = hidden_norm(F W_fc^T), (B, S, H).
at::Tensor draft_embeddings(const FrozenWeights& f, const DraftLayout& layout);
at::Tensor draft_context(const DrafterWeights& w, const at::Tensor& features, double eps);

// q (B, nh, Q, hd), k/v (B, nkv, S+Q, hd) -> attention output (B, nh, Q, hd).
using AttentionFn =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// Step 6: one drafter layer. x (B, Q, H), context (B, S, H) -> (B, Q, H).
at::Tensor drafter_layer(const at::Tensor& x, const at::Tensor& context,
                         const DecoderLayerWeights& w, const LayerShape& s, const DraftRope& rope,
                         const AttentionFn& attend);

// Student hidden D = norm(x) after the drafter layers: (B, Q, H), with graph.
at::Tensor drafter_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                          const StepInputs& in, const DraftLayout& layout);

// The distillation terms per position, (B, Q) each, from full (B, Q, V)
// student and teacher log-probabilities at temperature T (docs/LOSSES.md);
// a term whose weight is 0 comes back as zeros.
struct DistillTerms {
  at::Tensor kl, reverse_kl, jsd, tv;
};
DistillTerms distill_terms(const LossConfig& loss, const at::Tensor& log_ps,
                           const at::Tensor& log_pt);

// D-PACE weights (docs/LOSSES.md), (B, Q) float64, detached, from the per-slot
// CE (B, Q) and the counted slots (B, Q) bool of blocks of `block_size`.
at::Tensor dpace_weights(const at::Tensor& ce, const at::Tensor& counted, int64_t block_size,
                         double alpha);

// Loss and metrics from D with full (B, Q, V) logits (SPEC steps 8-10).
StepOutputs loss_and_metrics(const Config& c, const at::Tensor& student_hidden,
                             const at::Tensor& target_hidden, const at::Tensor& lm_head,
                             const DraftLayout& layout, const Anchors& a);

// The whole forward: layout, drafter, loss. Matches dflash::StepFn. Trainable
// weights may be fp32 masters of a bfloat16 run: they are cast to the run
// dtype (differentiably) before use.
StepOutputs drafter_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                         const StepInputs& in);

}  // namespace dflash::reference
