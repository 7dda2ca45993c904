#include "harness/memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "optimized/aten_rows.h"
#include "optimized/chunked_loss.h"

namespace dflash::harness {

LossTerms LossTerms::of(const LossConfig& l) {
  LossTerms t;
  t.teacher = l.uses_teacher();
  t.student_probs = l.uses_student_probs();
  // The row implementations' own term plan: the JSD between its endpoints.
  const optimized::RowObjectives o = optimized::row_objectives(l);
  t.mixture = optimized::plan_terms(o).jsd_mid;
  for (double w : {l.kl_weight, l.reverse_kl_weight, l.jsd_weight, l.tv_weight})
    t.distill_terms += w != 0;
  t.aten_row_slices = int(optimized::aten_row_slices(o));
  return t;
}

std::string LossTerms::text() const {
  if (!teacher) return "ce";
  return fmt::format("teacher{}{}, {} term(s)", student_probs ? " + p_s" : "",
                     mixture ? " + mixture" : "", distill_terms);
}

namespace {

// The ATen twin's (n, V) working set per element, in bytes.
double aten_row_bytes(const LossTerms& t, double up, double a) {
  if (!t.teacher) return up + a;
  if (!t.student_probs) return up + 3 * a + 1;
  // p_s, p_t and d (log p_t, log p_s in place; the output at T != 1); the
  // JSD's mixture adds u and one transient, and the rows run in slices
  // (optimized::aten_row_slices: 2 with the mixture).
  return (t.mixture ? up + 5 * a : up + 4 * a) / t.aten_row_slices;
}

}  // namespace

Formula chunked_loss_bytes(const LossSizes& z, const LossTerms& terms, int64_t e,
                           optimized::Kernels kernels) {
  const int64_t M = z.M, Ns = z.Ns, H = z.H, V = z.V, C = z.C;
  const double k = terms.teacher ? 1 : 0;
  const double a = e == 8 ? 8 : 4, up = e < a ? a : 0;
  const bool aten = kernels == optimized::Kernels::kAten;
  const double per = aten ? aten_row_bytes(terms, up, a) : 0.0;
  const double rows = double(std::min(C, M) * V) * per;
  const double fwd = double(Ns * H * e) + (1 + k) * double(C * V * e) +
                     (2 + k) * double(C * H * e) + 56.0 * double(M) + rows;
  const double bwd = 2.0 * double(Ns * H * e);
  return {std::max(fwd, bwd),
          fmt::format("max(NsHe + (1+t)CVe + (2+t)CHe + 56M + rows, 2NsHe), rows = CV x {} B "
                      "({} kernels), M={} Ns={} H={} V={} C={} loss {} e={}",
                      per, optimized::kernels_name(kernels), M, Ns, H, V, C, terms.text(), e)};
}

Formula chunked_no_recompute_loss_bytes(int64_t Q, int64_t V, int64_t C, const LossTerms& terms,
                                        int64_t e) {
  const double up = e < 4 ? 4 : 0, k = terms.teacher ? 1 : 0;
  // Saved per element: 8 bytes for the teacher's terms, 4 more for the
  // student's probabilities, 16 more for the mixture, 1 for each
  // further term; transients alike.
  const double saved = 8 * k + (terms.student_probs ? 4 : 0) + (terms.mixture ? 16 : 0) +
                       1.0 * std::max(0, terms.distill_terms - 1);
  const double transient = 2 * k + (terms.student_probs ? 1 : 0) + (terms.mixture ? 4 : 0);
  double peak = 0;
  for (int64_t r0 = 0; r0 < Q; r0 += std::max<int64_t>(C, 1)) {
    const int64_t n = std::min(C, Q - r0);
    peak = std::max(peak, double(V) * ((double(e) + up + saved) * double(r0 + n) +
                                       4.0 * (3 + transient) * double(n)));
  }
  return {peak, fmt::format("max over chunks of V(e + up + {})(rows so far) + 4V(3+{})n, Q={} "
                            "V={} C={} loss {} e={}",
                            saved, transient, Q, V, C, terms.text(), e)};
}

Formula unchunked_loss_bytes(int64_t Q, int64_t V, const LossTerms& terms, int64_t e) {
  const double copies = 5 + 2 * (terms.teacher ? 1 : 0) + (terms.student_probs ? 1 : 0) +
                        7 * (terms.mixture ? 1 : 0) + std::max(0, terms.distill_terms - 1);
  const double bytes =
      4.0 * double(Q) * double(V) * copies + (e < 4 ? double(e) * double(Q) * double(V) : 0.0);
  return {bytes, fmt::format("4QV x {} copies (+ eQV when e < 4), Q={} V={} loss {}", copies, Q, V,
                             terms.text())};
}

AttentionSizes AttentionSizes::of(const LayerShape& s, int64_t B, int64_t Q, int64_t S) {
  AttentionSizes z;
  z.B = B, z.Q = Q, z.S = S;
  z.nh = s.num_attention_heads, z.nkv = s.num_key_value_heads, z.hd = s.head_dim;
  return z;
}

Formula sparse_attention_bytes(const AttentionSizes& z, int64_t T, int64_t e, int64_t a,
                               optimized::Kernels kernels) {
  const int64_t B = z.B, nh = z.nh, nkv = z.nkv, Q = z.Q, S = z.S, hd = z.hd;
  const int64_t R = (nh / nkv) * Q;
  // Low-precision inputs also keep the output in acc precision for backward.
  const double outputs = double(e) * double(2 * B * nh * Q * hd + 2 * B * nkv * (S + Q) * hd) +
                         double(a * B * nh * Q) + (e < a ? double(a * B * nh * Q * hd) : 0.0);
  const double head = double(3 * e + 3 * a) * double(R * hd) + 2.0 * a * double((S + Q) * hd) +
                      2.0 * a * double(R * std::min(T, S + Q));
  const bool aten = kernels == optimized::Kernels::kAten;
  const double mask = aten ? double(R * std::min(T, S + Q)) : 0.0;
  return {outputs + head + mask,
          fmt::format("e(2B nh Q hd + 2B nkv (S+Q) hd) + a B nh Q + (3e+3a) R hd + 2a (S+Q) hd + "
                      "2a R T{}, R={} ({} kernels)",
                      aten ? " + R T" : "", R, optimized::kernels_name(kernels))};
}

Formula target_attention_bytes(const AttentionSizes& z, int64_t e) {
  const int64_t B = z.B, nh = z.nh, S = z.S, hd = z.hd, q = z.Q;
  // Per chunk (reference::masked_attention over keys [0, q0 + q)): K and V
  // repeated to the nh heads, the causal mask (bool, shared by the batch)
  // and its fp32 copy per row, three fp32 (B, nh, q, S) score tensors alive
  // at once; chunked, the chunks' outputs and their concatenation.
  const double rows = double(q) * double(S);
  const double bytes = 2.0 * double(e * B * nh * S * hd) + rows * (1.0 + 4.0 * double(B)) +
                       12.0 * double(B * nh) * rows;
  if (q >= S) return {bytes, "2e B nh S hd + (1 + 4B) S^2 + 12 B nh S^2"};
  return {bytes + 2.0 * double(e * B * nh * S * hd),
          fmt::format("4e B nh S hd + (1 + 4B) q S + 12 B nh q S, q = {}", q)};
}

Formula dense_scores_one_copy(int64_t B, int64_t nh, int64_t Q, int64_t S) {
  return {4.0 * double(B) * double(nh) * double(Q) * double(S + Q),
          fmt::format("4 B nh Q (S+Q) = fp32 [{}, {}, {}, {}]", B, nh, Q, S + Q)};
}

Formula dense_attention_saved_bytes(const AttentionSizes& z, int64_t e) {
  const int64_t B = z.B, nh = z.nh, nkv = z.nkv, Q = z.Q, S = z.S, hd = z.hd;
  // Beyond what the sparse path saves (its q/k/v copies, output and lse are
  // in layer_activation_bytes): K and V repeated to the nh heads, minus the
  // sparse path's own q and output copies.
  const double bytes = 2.4 * dense_scores_one_copy(B, nh, Q, S).bytes +
                       2.0 * double(e) * double(B * (nh - nkv) * (S + Q) * hd) -
                       2.0 * double(e) * double(B * nh * Q * hd) - 100.0 * double(B * nh * Q);
  return {std::max(bytes, 0.0),
          "2.4 x 4 B nh Q (S+Q) + 2e B (nh-nkv)(S+Q) hd - 2e B nh Q hd - 100 B nh Q"};
}

Formula layer_activation_bytes(int64_t B, int64_t Q, int64_t S, const LayerShape& s, int64_t e) {
  const double BQ = double(B * Q), BK = double(B * (S + Q));
  const double bytes =
      double(e) *
      (6.5 * BQ * double(s.hidden_size) + 6.0 * BQ * double(s.num_attention_heads * s.head_dim) +
       2.2 * BQ * double(s.intermediate_size) + 0.5 * BK * double(s.hidden_size) +
       5.0 * BK * double(s.num_key_value_heads * s.head_dim));
  return {bytes, "e(6.5BQH + 6BQ nh hd + 2.2BQI + 0.5B(S+Q)H + 5B(S+Q) nkv hd)"};
}

Formula mlp_share_bytes(int64_t B, int64_t Q, int64_t H, int64_t I, int64_t e) {
  return {double(e) * (2.2 * double(B * Q * I) + 2.0 * double(B * Q * H)), "e(2.2BQI + 2BQH)"};
}

Formula checkpointed_saved_bytes(int64_t layers, const AttentionSizes& z, int64_t H, int64_t e) {
  const int64_t B = z.B, Q = z.Q, S = z.S, hd = z.hd;
  return {double((layers + 3) * B * Q * H * e) + double(2 * B * (S + Q) * hd * e),
          fmt::format("(layers+3) BQHe + 2B(S+Q) hd e, layers={}", layers)};
}

Formula context_bytes(int64_t B, int64_t S, int64_t H, int64_t e) {
  return {double(3 * B * S * H * e), "3 BSHe"};
}

int64_t layer_param_count(const LayerShape& s) {
  const int64_t H = s.hidden_size, qd = s.num_attention_heads * s.head_dim,
                kvd = s.num_key_value_heads * s.head_dim;
  return 2 * H + H * qd + 2 * H * kvd + qd * H + 2 * s.head_dim + 3 * H * s.intermediate_size;
}

int64_t drafter_param_count(const Config& c) {
  const int64_t H = c.drafter.shape.hidden_size;
  return H * c.num_taps() * H + 2 * H +
         c.drafter.num_hidden_layers * layer_param_count(c.drafter.shape);
}

int64_t target_param_count(const Config& c) {
  const int64_t VH = c.target.vocab_size * c.target.shape.hidden_size;
  return VH * (c.target.tie_word_embeddings ? 1 : 2) + c.target.shape.hidden_size +
         c.target.num_hidden_layers * layer_param_count(c.target.shape);
}

}  // namespace dflash::harness
