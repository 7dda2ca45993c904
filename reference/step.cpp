// The reference DFlash step. What it deliberately leaves out, so that it can
// be read against SPEC.md line by line:
//   - no loss chunking: the full (B, Q, V) student and teacher logits exist;
//   - no activation checkpointing: autograd keeps every activation;
//   - no sparsity: attention builds the dense (B, Q, S+Q) mask and scores;
//   - no custom backward: every gradient comes from plain autograd;
//   - no mixed-precision tricks: bfloat16 runs cast the fp32 masters and
//     compute in bf16, with only the softmax/norm statistics in fp32;
//   - no distribution: one process, one batch; sums are returned beside the
//     ratios so callers can normalise globally;
//   - no fused objectives: every distillation term (docs/LOSSES.md) is its
//     textbook formula on full (B, Q, V) log-probabilities, differentiated by
//     autograd, and D-PACE's weights are built slot by slot as the paper
//     writes them.
// Everything it computes is what optimized/ must reproduce.
#include "reference/step.h"

#include <vector>

#include "reference/layers.h"

namespace dflash::reference {

at::Tensor build_draft_mask(const Anchors& a, int64_t S, int64_t bs) {
  const int64_t Q = a.num_anchors() * bs;
  const auto idx = a.anchors.options();         // int64 on the anchors' device
  const at::Tensor j = at::arange(S + Q, idx);  // (S+Q) key index
  const at::Tensor slot_block = at::arange(Q, idx).div(bs, "floor");  // (Q) n of slot q
  const at::Tensor anchor = a.anchors.repeat_interleave(bs, 1);       // (B, Q)
  const at::Tensor keep = a.keep.repeat_interleave(bs, 1);            // (B, Q)
  // Context strictly before the anchor ...
  const at::Tensor context = (j < S) & (j < anchor.unsqueeze(-1));  // (B, Q, S+Q)
  // ... or the slot's own block, both directions.
  const at::Tensor own =
      (j >= S) & ((j - S).div(bs, "floor") == slot_block.unsqueeze(-1));  // (Q, S+Q)
  return (context | own) & keep.unsqueeze(-1);                            // (B, Q, S+Q)
}

at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t S, int64_t bs) {
  return masked_attention(q, k, v, build_draft_mask(a, S, bs));
}

DraftRope draft_rope(int64_t S, const at::Tensor& positions, const LayerShape& s,
                     at::ScalarType dtype) {
  const int64_t B = positions.size(0), Q = positions.size(1);
  const at::Tensor key_pos =
      at::cat({at::arange(S, positions.options()).expand({B, S}), positions}, 1);  // (B, S+Q)
  auto [cos_k, sin_k] = rope_cos_sin(key_pos, s, dtype);                           // (B, S+Q, hd)
  DraftRope r;
  r.cos_k = cos_k.unsqueeze(1);  // (B, 1, S+Q, hd)
  r.sin_k = sin_k.unsqueeze(1);
  r.cos_q = r.cos_k.narrow(2, S, Q);  // (B, 1, Q, hd)
  r.sin_q = r.sin_k.narrow(2, S, Q);
  return r;
}

at::Tensor draft_embeddings(const FrozenWeights& f, const DraftLayout& layout) {
  const int64_t B = layout.noise_ids.size(0), Q = layout.noise_ids.size(1);
  return f.embed_tokens.index_select(0, layout.noise_ids.reshape(-1))
      .view({B, Q, f.embed_tokens.size(1)});
}

at::Tensor draft_context(const DrafterWeights& w, const at::Tensor& features, double eps) {
  return rms_norm(project(features, w.fc), w.hidden_norm, eps);  // (B, S, H)
}

at::Tensor drafter_layer(const at::Tensor& x, const at::Tensor& context,
                         const DecoderLayerWeights& w, const LayerShape& s, const DraftRope& rope,
                         const AttentionFn& attend) {
  const int64_t nh = s.num_attention_heads, nkv = s.num_key_value_heads, hd = s.head_dim;
  const double eps = s.rms_norm_eps;
  const at::Tensor h = rms_norm(x, w.input_layernorm, eps);  // (B, Q, H)
  const at::Tensor kv_in = at::cat({context, h}, 1);         // (B, S+Q, H)
  const at::Tensor q = apply_rope(normed_heads(h, w.q_proj, w.q_norm, nh, hd, eps), rope.cos_q,
                                  rope.sin_q);  // (B, nh, Q, hd)
  const at::Tensor k = apply_rope(normed_heads(kv_in, w.k_proj, w.k_norm, nkv, hd, eps), rope.cos_k,
                                  rope.sin_k);                                // (B, nkv, S+Q, hd)
  const at::Tensor v = split_heads(project(kv_in, w.v_proj), nkv, hd);        // (B, nkv, S+Q, hd)
  const at::Tensor x1 = x + project(merge_heads(attend(q, k, v)), w.o_proj);  // (B, Q, H)
  return x1 + swiglu_mlp(rms_norm(x1, w.post_attention_layernorm, eps), w);
}

at::Tensor drafter_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                          const StepInputs& in, const DraftLayout& layout) {
  const LayerShape& s = c.drafter.shape;
  const int64_t S = in.input_ids.size(1), bs = layout.block_size;
  at::Tensor x = draft_embeddings(f, layout);                                // (B, Q, H)
  const at::Tensor context = draft_context(w, in.features, s.rms_norm_eps);  // (B, S, H)
  const DraftRope rope = draft_rope(S, layout.positions, s, x.scalar_type());
  // Step 7: the dense mask, built once for every layer.
  const at::Tensor visible = build_draft_mask(in.anchors, S, bs);  // (B, Q, S+Q)
  auto attend = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return masked_attention(q, k, v, visible);
  };
  for (const DecoderLayerWeights& lw : w.layers) x = drafter_layer(x, context, lw, s, rope, attend);
  return rms_norm(x, w.norm, s.rms_norm_eps);  // (B, Q, H)
}

// Per-position distillation terms (docs/LOSSES.md), each (B, Q), from the
// student and teacher log-probabilities at temperature T. A term is computed
// only when the loss uses it (its value is reported as 0 otherwise).
DistillTerms distill_terms(const LossConfig& L, const at::Tensor& log_ps,
                           const at::Tensor& log_pt) {
  // Each term only when its weight asks for it (the full-logits arrays are
  // what bounds the reference's memory).
  const at::Tensor pt = log_pt.exp();                                          // (B, Q, V)
  const at::Tensor ps = L.uses_student_probs() ? log_ps.exp() : at::Tensor();  // (B, Q, V)
  auto forward = [&] { return (pt * (log_pt - log_ps)).sum(-1); };  // KL(p_t || p_s), (B, Q)
  auto reverse = [&] { return (ps * (log_ps - log_pt)).sum(-1); };  // KL(p_s || p_t), (B, Q)
  const at::Tensor none = at::zeros_like(log_ps.select(-1, 0));     // (B, Q)
  DistillTerms t{none, none, none, none};
  if (L.kl_weight != 0) t.kl = forward();
  if (L.reverse_kl_weight != 0) t.reverse_kl = reverse();
  if (L.jsd_weight != 0) {
    // beta = 0 and 1 are the two KLs (TRL's convention: the mixture formula
    // itself vanishes there).
    const double b = L.jsd_beta;
    if (b == 0) {
      t.jsd = forward();
    } else if (b == 1) {
      t.jsd = reverse();
    } else {
      // log m = log(b p_t + (1-b) p_s), by log-sum-exp over the two sides.
      const at::Tensor log_m =
          at::logsumexp(at::stack({log_pt + std::log(b), log_ps + std::log1p(-b)}), 0);
      t.jsd = b * (pt * (log_pt - log_m)).sum(-1) + (1 - b) * (ps * (log_ps - log_m)).sum(-1);
    }
  }
  if (L.tv_weight != 0) t.tv = 0.5 * (ps - pt).abs().sum(-1);
  return t;
}

// D-PACE (arXiv 2605.18810, Model-Optimizer's dflash plugin), written as the
// paper states it, block by block: the drafter's confidence in the label
// q_k = exp(-CE_k), smoothed (1-alpha) q_k + alpha; the cumulative
// confidence C_k = prod over counted slots i <= k; w_k = sum over counted
// m >= k of C_m. Detached: the weights carry no gradient. (B, Q) float64.
at::Tensor dpace_weights(const at::Tensor& ce_tok, const at::Tensor& counted, int64_t bs,
                         double alpha) {
  const int64_t B = ce_tok.size(0), N = ce_tok.size(1) / bs;
  const at::Tensor q = ce_tok.detach().to(at::kDouble).neg().exp().view({B, N, bs});  // (B, N, bs)
  const at::Tensor c = counted.view({B, N, bs});
  std::vector<at::Tensor> prefix;  // C_k per slot, 0 where not counted: (B, N) each
  at::Tensor running = at::ones({B, N}, q.options());
  for (int64_t k = 0; k < bs; ++k) {
    const at::Tensor ck = c.select(2, k);
    running = running * at::where(ck, (1 - alpha) * q.select(2, k) + alpha, 1.0);
    prefix.push_back(running * ck);
  }
  std::vector<at::Tensor> w(static_cast<size_t>(bs));
  at::Tensor suffix = at::zeros({B, N}, q.options());
  for (int64_t k = bs - 1; k >= 0; --k) {
    suffix = suffix + prefix[size_t(k)];
    w[size_t(k)] = suffix * c.select(2, k);
  }
  return at::stack(w, 2).view({B, N * bs});
}

StepOutputs loss_and_metrics(const Config& c, const at::Tensor& D, const at::Tensor& Ht,
                             const at::Tensor& lm_head, const DraftLayout& layout,
                             const Anchors& a) {
  const LossConfig& L = c.loss;
  const int64_t B = D.size(0), Q = D.size(1), H = D.size(2);
  const at::ScalarType acc = D.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor logits = project(D, lm_head).to(acc);  // (B, Q, V)
  const at::Tensor lse = at::logsumexp(logits, -1);       // (B, Q)
  const at::Tensor ce_tok =
      lse - logits.gather(-1, layout.labels.unsqueeze(-1)).squeeze(-1);  // (B, Q)
  // Teacher: the target's next-token distribution at anchor_n + k - 1,
  // computed only when an objective needs it.
  const at::Tensor none = at::zeros_like(ce_tok);  // (B, Q)
  DistillTerms t{none, none, none, none};
  if (L.uses_teacher()) {
    const at::Tensor teacher_h = Ht.gather(1, layout.teacher_index.unsqueeze(-1).expand({B, Q, H}));
    const at::Tensor teacher = project(teacher_h, lm_head).to(acc);          // (B, Q, V)
    const at::Tensor log_pt = at::log_softmax(teacher / L.temperature, -1);  // (B, Q, V)
    const at::Tensor log_ps = at::log_softmax(logits / L.temperature, -1);   // (B, Q, V)
    t = distill_terms(L, log_ps, log_pt);
  }

  // Step 8's weights; D-PACE replaces the decay by its detached weights.
  at::Tensor w = layout.weights.to(acc);  // (B, Q)
  if (L.weighting == Weighting::kDpace)
    w = (w * dpace_weights(ce_tok, layout.counted, layout.block_size, L.dpace_alpha)).to(acc);
  StepOutputs out;
  const at::Tensor wsum = w.sum();
  const at::Tensor den = at::where(wsum > 0, wsum, at::ones_like(wsum));  // 0/0 := 0
  const at::Tensor ce_sum = (w * ce_tok).sum(), kl_sum = (w * t.kl).sum(),
                   rkl_sum = (w * t.reverse_kl).sum(), jsd_sum = (w * t.jsd).sum(),
                   tv_sum = (w * t.tv).sum();
  out.loss = (L.ce_weight * ce_sum + L.kl_weight * kl_sum + L.reverse_kl_weight * rkl_sum +
              L.jsd_weight * jsd_sum + L.tv_weight * tv_sum) /
             den;
  out.ce = (ce_sum / den).detach(), out.ce_sum = ce_sum.detach();
  out.kl = (kl_sum / den).detach(), out.kl_sum = kl_sum.detach();
  out.reverse_kl = (rkl_sum / den).detach(), out.reverse_kl_sum = rkl_sum.detach();
  out.jsd = (jsd_sum / den).detach(), out.jsd_sum = jsd_sum.detach();
  out.tv = (tv_sum / den).detach(), out.tv_sum = tv_sum.detach();
  out.weight_sum = wsum.detach();

  // Step 10: per-slot accuracy and the acceptance length tau.
  out.set_metrics(slot_metrics(logits.argmax(-1) == layout.labels, layout, a));
  out.student_hidden = D.detach();
  return out;
}

StepOutputs drafter_step(const Config& c, const DrafterWeights& master, const FrozenWeights& f,
                         const StepInputs& in) {
  const DrafterWeights w = cast(master, f.lm_head.scalar_type());
  const DraftLayout layout =
      make_draft_layout(in.input_ids, in.loss_mask, in.anchors, c.data.block_size,
                        c.data.mask_token_id, c.loss.gamma);
  const at::Tensor D = drafter_hidden(c, w, f, in, layout);
  return loss_and_metrics(c, D, in.target_hidden, f.lm_head, layout, in.anchors);
}

}  // namespace dflash::reference
