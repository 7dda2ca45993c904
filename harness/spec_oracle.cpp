// docs/SPEC.md, "One step", as loops over doubles. Step numbers below are
// SPEC's. Nothing here calls into core/ or reference/ (see the header).
#include "harness/spec_oracle.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dflash::harness {
namespace {

using Vec = std::vector<double>;

struct Dims {
  int64_t B, S, N, bs, Q, H, V, L, nh, nkv, hd, I, layers;
};

const Vec& param(const OracleParams& p, const std::string& name) {
  const auto it = p.find(name);
  if (it == p.end()) throw std::runtime_error("spec oracle: missing parameter " + name);
  return it->second;
}

// y = x * rsqrt(mean(x^2) + eps) * w over n elements.
void rmsnorm(const double* x, const double* w, int64_t n, double eps, double* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

// y (out) = W (out, in) x (in).
void linear(const Vec& W, const double* x, int64_t in, int64_t out, double* y) {
  for (int64_t o = 0; o < out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < in; ++i) s += W[size_t(o * in + i)] * x[i];
    y[o] = s;
  }
}

// RoPE of one head vector at `pos`: x*cos + rotate_half(x)*sin.
void rope(double* x, int64_t hd, double pos, double theta) {
  const int64_t half = hd / 2;
  Vec out(static_cast<size_t>(hd));
  for (int64_t d = 0; d < hd; ++d) {
    const int64_t i = d % half;
    const double angle = pos * std::pow(theta, -2.0 * double(i) / double(hd));
    const double rot = d < half ? -x[d + half] : x[d - half];
    out[size_t(d)] = x[d] * std::cos(angle) + rot * std::sin(angle);
  }
  std::copy(out.begin(), out.end(), x);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

struct Layout {  // steps 3, 5 and 8 for every draft slot (b, n, k)
  std::vector<int64_t> noise, pos, label, teacher;  // (B, Q)
  Vec w;                                            // (B, Q) with decay
  std::vector<uint8_t> counted;                     // (B, Q) w > 0 before decay
};

Layout layout(const Config& c, const OracleInputs& in, const Dims& d) {
  Layout l;
  const size_t n_slots = size_t(d.B * d.Q);
  l.noise.assign(n_slots, c.data.mask_token_id);
  l.pos.assign(n_slots, 0);
  l.label.assign(n_slots, 0);
  l.teacher.assign(n_slots, 0);
  l.w.assign(n_slots, 0.0);
  l.counted.assign(n_slots, 0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t n = 0; n < d.N; ++n) {
      const int64_t a = in.anchors[size_t(b * d.N + n)];
      const bool keep = in.keep[size_t(b * d.N + n)] != 0;
      for (int64_t k = 0; k < d.bs; ++k) {
        const size_t s = size_t(b * d.Q + n * d.bs + k);
        const int64_t at = a + k;
        if (k == 0 && keep) l.noise[s] = in.input_ids[size_t(b * d.S + a)];
        l.pos[s] = at;
        if (at < d.S) l.label[s] = in.input_ids[size_t(b * d.S + at)];
        l.teacher[s] = std::clamp<int64_t>(at - 1, 0, d.S - 1);  // in range even when unused
        const bool counted = keep && at < d.S && k > 0 && in.loss_mask[size_t(b * d.S + at)];
        l.counted[s] = counted;
        const double decay =
            c.loss.gamma == 0 ? 1.0 : std::exp(-double(std::max<int64_t>(k - 1, 0)) / c.loss.gamma);
        l.w[s] = counted ? decay : 0.0;
      }
    }
  return l;
}

// Step 4: C = hidden_norm(F W_fc^T), (B, S, H).
Vec context(const Config& c, const OracleInputs& in, const OracleParams& p, const Dims& d) {
  Vec C(size_t(d.B * d.S * d.H)), t(size_t(d.H));
  for (int64_t r = 0; r < d.B * d.S; ++r) {
    linear(param(p, "fc.weight"), &in.features[size_t(r * d.L * d.H)], d.L * d.H, d.H, t.data());
    rmsnorm(t.data(), param(p, "hidden_norm.weight").data(), d.H, c.drafter.shape.rms_norm_eps,
            &C[size_t(r * d.H)]);
  }
  return C;
}

// Step 7: may draft slot (n, k) of row b see key j of [context; draft]?
bool visible(const OracleInputs& in, const Dims& d, int64_t b, int64_t slot, int64_t j) {
  const int64_t n = slot / d.bs;
  if (!in.keep[size_t(b * d.N + n)]) return false;
  if (j < d.S) return j < in.anchors[size_t(b * d.N + n)];
  return (j - d.S) / d.bs == n;
}

// Step 7 for one query head of draft slot t in row b: softmax over the
// visible keys of k (K, nkv*hd), weighted sum of v into out (hd); a slot
// that sees no key leaves out at exactly 0.
void attend(const OracleInputs& in, const Dims& d, int64_t b, int64_t t, int64_t hh,
            const double* qh, const Vec& k, const Vec& v, double* out) {
  const int64_t K = d.S + d.Q, kvd = d.nkv * d.hd, g = hh / (d.nh / d.nkv);  // GQA
  double mx = -INFINITY;
  Vec sc(size_t(K), -INFINITY);
  for (int64_t j = 0; j < K; ++j) {
    if (!visible(in, d, b, t, j)) continue;
    double dot = 0;
    for (int64_t e = 0; e < d.hd; ++e) dot += qh[e] * k[size_t(j * kvd + g * d.hd + e)];
    sc[size_t(j)] = dot / std::sqrt(double(d.hd));
    mx = std::max(mx, sc[size_t(j)]);
  }
  if (mx == -INFINITY) return;  // sees nothing: exactly 0
  double z = 0;
  for (int64_t j = 0; j < K; ++j)
    z += sc[size_t(j)] == -INFINITY ? 0 : std::exp(sc[size_t(j)] - mx);
  for (int64_t j = 0; j < K; ++j) {
    if (sc[size_t(j)] == -INFINITY) continue;
    const double pj = std::exp(sc[size_t(j)] - mx) / z;
    for (int64_t e = 0; e < d.hd; ++e) out[e] += pj * v[size_t(j * kvd + g * d.hd + e)];
  }
}

// Step 6 for one layer, updating x (B, Q, H) in place.
void layer(const Config& c, const OracleInputs& in, const OracleParams& p, const Dims& d,
           const Layout& l, const Vec& C, int64_t i, Vec& x) {
  const auto& s = c.drafter.shape;
  const std::string pre = fmt::format("layers.{}.", i);
  const double eps = s.rms_norm_eps;
  const int64_t K = d.S + d.Q, qd = d.nh * d.hd, kvd = d.nkv * d.hd;
  for (int64_t b = 0; b < d.B; ++b) {
    Vec h(size_t(d.Q * d.H)), q(size_t(d.Q * qd)), k(size_t(K * kvd)), v(size_t(K * kvd));
    for (int64_t t = 0; t < d.Q; ++t)
      rmsnorm(&x[size_t((b * d.Q + t) * d.H)], param(p, pre + "input_layernorm.weight").data(), d.H,
              eps, &h[size_t(t * d.H)]);
    for (int64_t t = 0; t < d.Q; ++t) {
      double* qt = &q[size_t(t * qd)];
      linear(param(p, pre + "self_attn.q_proj.weight"), &h[size_t(t * d.H)], d.H, qd, qt);
      for (int64_t hh = 0; hh < d.nh; ++hh) {
        double* head = qt + hh * d.hd;
        rmsnorm(head, param(p, pre + "self_attn.q_norm.weight").data(), d.hd, eps, head);
        rope(head, d.hd, double(l.pos[size_t(b * d.Q + t)]), s.rope_theta);
      }
    }
    for (int64_t j = 0; j < K; ++j) {  // keys and values of [C; h]
      const double* row = j < d.S ? &C[size_t((b * d.S + j) * d.H)] : &h[size_t((j - d.S) * d.H)];
      const double pos = j < d.S ? double(j) : double(l.pos[size_t(b * d.Q + j - d.S)]);
      double* kj = &k[size_t(j * kvd)];
      linear(param(p, pre + "self_attn.k_proj.weight"), row, d.H, kvd, kj);
      linear(param(p, pre + "self_attn.v_proj.weight"), row, d.H, kvd, &v[size_t(j * kvd)]);
      for (int64_t g = 0; g < d.nkv; ++g) {
        double* head = kj + g * d.hd;
        rmsnorm(head, param(p, pre + "self_attn.k_norm.weight").data(), d.hd, eps, head);
        rope(head, d.hd, pos, s.rope_theta);
      }
    }
    Vec attn(size_t(qd), 0.0), o(size_t(d.H)), h2(size_t(d.H)), gate(size_t(d.I)), up(size_t(d.I)),
        down(size_t(d.H));
    for (int64_t t = 0; t < d.Q; ++t) {
      std::fill(attn.begin(), attn.end(), 0.0);
      for (int64_t hh = 0; hh < d.nh; ++hh)
        attend(in, d, b, t, hh, &q[size_t(t * qd + hh * d.hd)], k, v, &attn[size_t(hh * d.hd)]);
      double* xt = &x[size_t((b * d.Q + t) * d.H)];
      linear(param(p, pre + "self_attn.o_proj.weight"), attn.data(), qd, d.H, o.data());
      for (int64_t e = 0; e < d.H; ++e) xt[e] += o[size_t(e)];
      rmsnorm(xt, param(p, pre + "post_attention_layernorm.weight").data(), d.H, eps, h2.data());
      linear(param(p, pre + "mlp.gate_proj.weight"), h2.data(), d.H, d.I, gate.data());
      linear(param(p, pre + "mlp.up_proj.weight"), h2.data(), d.H, d.I, up.data());
      for (int64_t e = 0; e < d.I; ++e) gate[size_t(e)] = silu(gate[size_t(e)]) * up[size_t(e)];
      linear(param(p, pre + "mlp.down_proj.weight"), gate.data(), d.I, d.H, down.data());
      for (int64_t e = 0; e < d.H; ++e) xt[e] += down[size_t(e)];
    }
  }
}

// log softmax of logits / T over V entries.
Vec log_softmax(const Vec& z, double T) {
  double mx = -INFINITY;
  for (double v : z) mx = std::max(mx, v / T);
  double s = 0;
  for (double v : z) s += std::exp(v / T - mx);
  Vec out(z.size());
  for (size_t i = 0; i < z.size(); ++i) out[i] = z[i] / T - mx - std::log(s);
  return out;
}

// The distillation terms of one slot (docs/LOSSES.md), from the log
// probabilities at temperature T: KL(p_t || p_s), KL(p_s || p_t), JSD_beta
// (the two KLs at beta 0 and 1), total variation.
struct SlotTerms {
  double kl = 0, rkl = 0, jsd = 0, tv = 0;
};

SlotTerms slot_terms(const LossConfig& L, const Vec& lt, const Vec& ls) {
  SlotTerms t;
  double kl_tm = 0, kl_sm = 0;
  const double b = L.jsd_beta;
  for (size_t v = 0; v < lt.size(); ++v) {
    const double pt = std::exp(lt[v]), ps = std::exp(ls[v]);
    t.kl += pt * (lt[v] - ls[v]);
    t.rkl += ps * (ls[v] - lt[v]);
    t.tv += 0.5 * std::abs(ps - pt);
    if (b > 0 && b < 1) {
      const double a = std::log(b) + lt[v], c = std::log1p(-b) + ls[v];
      const double lm = std::max(a, c) + std::log1p(std::exp(-std::abs(a - c)));
      kl_tm += pt * (lt[v] - lm), kl_sm += ps * (ls[v] - lm);
    }
  }
  t.jsd = b == 0 ? t.kl : b == 1 ? t.rkl : b * kl_tm + (1 - b) * kl_sm;
  return t;
}

// D-PACE (docs/LOSSES.md) in place over w: per block, C_k = prod over
// counted i <= k of (1-alpha) exp(-CE_i) + alpha, w_k = sum over counted
// m >= k of C_m.
void dpace(const Config& c, const Dims& d, const Layout& l, const Vec& ce, Vec& w) {
  for (int64_t blk = 0; blk < d.B * d.N; ++blk) {
    const size_t s0 = size_t(blk * d.bs);
    Vec C(size_t(d.bs), 0.0);
    double run = 1;
    for (int64_t k = 0; k < d.bs; ++k)
      if (l.counted[s0 + size_t(k)]) {
        run *= (1 - c.loss.dpace_alpha) * std::exp(-ce[s0 + size_t(k)]) + c.loss.dpace_alpha;
        C[size_t(k)] = run;
      }
    for (int64_t k = 0; k < d.bs; ++k) {
      double sum = 0;
      for (int64_t m = k; m < d.bs; ++m) sum += C[size_t(m)];
      w[s0 + size_t(k)] = l.counted[s0 + size_t(k)] ? sum : 0.0;
    }
  }
}

// Steps 8-10 on the student hidden D (B, Q, H).
// `fixed_w`: D-PACE weights held fixed (they are detached: the gradient
// does not flow through them), else computed from this forward's CE.
void loss_and_metrics(const Config& c, const OracleInputs& in, const OracleParams& p, const Dims& d,
                      const Layout& l, OracleResult& r, const Vec* fixed_w) {
  const Vec& W = param(p, "lm_head.weight");
  const LossConfig& L = c.loss;
  r.correct.assign(size_t(d.bs), 0);
  r.counted.assign(size_t(d.bs), 0);
  std::vector<uint8_t> right(size_t(d.B * d.Q), 0);
  Vec zs(size_t(d.V)), zt(size_t(d.V)), ce(size_t(d.B * d.Q), 0.0);
  std::vector<SlotTerms> terms(size_t(d.B * d.Q));
  for (int64_t s = 0; s < d.B * d.Q; ++s) {
    const int64_t b = s / d.Q, k = (s % d.Q) % d.bs;
    linear(W, &r.student_hidden[size_t(s * d.H)], d.H, d.V, zs.data());
    const Vec ls = log_softmax(zs, 1.0);
    const int64_t top = int64_t(std::max_element(zs.begin(), zs.end()) - zs.begin());
    right[size_t(s)] = top == l.label[size_t(s)];
    if (l.counted[size_t(s)]) r.counted[size_t(k)] += 1, r.correct[size_t(k)] += right[size_t(s)];
    ce[size_t(s)] = -ls[size_t(l.label[size_t(s)])];
    if (!L.uses_teacher() || !l.counted[size_t(s)]) continue;
    linear(W, &in.target_hidden[size_t((b * d.S + l.teacher[size_t(s)]) * d.H)], d.H, d.V,
           zt.data());
    terms[size_t(s)] = slot_terms(L, log_softmax(zt, L.temperature), log_softmax(zs, L.temperature));
  }
  Vec w = l.w;
  if (L.weighting == Weighting::kDpace) {
    if (fixed_w)
      w = *fixed_w;
    else
      dpace(c, d, l, ce, w);
  }
  r.weights = w;
  double ce_sum = 0, kl_sum = 0, rkl_sum = 0, jsd_sum = 0, tv_sum = 0, wsum = 0;
  for (size_t s = 0; s < w.size(); ++s) {
    wsum += w[s], ce_sum += w[s] * ce[s];
    kl_sum += w[s] * terms[s].kl, rkl_sum += w[s] * terms[s].rkl;
    jsd_sum += w[s] * terms[s].jsd, tv_sum += w[s] * terms[s].tv;
  }
  const double den = wsum > 0 ? wsum : 1.0;  // no counted slot: the loss is 0
  r.weight_sum = wsum;
  r.ce = ce_sum / den;
  r.kl = L.kl_weight != 0 ? kl_sum / den : 0.0;
  r.reverse_kl = L.reverse_kl_weight != 0 ? rkl_sum / den : 0.0;
  r.jsd = L.jsd_weight != 0 ? jsd_sum / den : 0.0;
  r.tv = L.tv_weight != 0 ? tv_sum / den : 0.0;
  r.loss = L.ce_weight * r.ce + L.kl_weight * r.kl + L.reverse_kl_weight * r.reverse_kl +
           L.jsd_weight * r.jsd + L.tv_weight * r.tv;
  r.correct[0] = 0;  // slot 0 is never counted
  int64_t kept = 0, accepted = 0;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t n = 0; n < d.N; ++n) {
      if (!in.keep[size_t(b * d.N + n)]) continue;
      ++kept;
      for (int64_t k = 1; k < d.bs; ++k) {
        const size_t s = size_t(b * d.Q + n * d.bs + k);
        if (!l.counted[s] || !right[s]) break;
        ++accepted;
      }
    }
  r.tau = kept ? 1.0 + double(accepted) / double(kept) : 1.0;
}

// Step 2's contract for anchors that were drawn elsewhere.
std::string check_anchors(const Config& c, const OracleInputs& in, const Dims& d) {
  int64_t most = 0;
  std::vector<int64_t> candidates(size_t(d.B), 0);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t a = 0; a + 1 < d.S; ++a)
      candidates[size_t(b)] +=
          in.loss_mask[size_t(b * d.S + a)] && in.loss_mask[size_t(b * d.S + a + 1)];
    most = std::max(most, candidates[size_t(b)]);
  }
  if (d.N != std::min(c.data.max_anchors, most))
    return fmt::format("N = {}, SPEC says min(max_anchors {}, most candidates {})", d.N,
                       c.data.max_anchors, most);
  for (int64_t b = 0; b < d.B; ++b) {
    int64_t kept = 0, prev = -1;
    for (int64_t n = 0; n < d.N; ++n) {
      const int64_t a = in.anchors[size_t(b * d.N + n)];
      if (!in.keep[size_t(b * d.N + n)]) {
        if (a != 0) return fmt::format("row {} anchor {}: padding must be anchor 0", b, n);
        continue;
      }
      ++kept;
      if (a <= prev) return fmt::format("row {}: kept anchors not ascending and distinct", b);
      prev = a;
      if (a > d.S - 2 || !in.loss_mask[size_t(b * d.S + a)] ||
          !in.loss_mask[size_t(b * d.S + a + 1)])
        return fmt::format("row {} anchor {} = {} is not a candidate", b, n, a);
    }
    if (kept != std::min(d.N, candidates[size_t(b)]))
      return fmt::format("row {} keeps {} anchors of {} candidates (N = {})", b, kept,
                         candidates[size_t(b)], d.N);
  }
  return "";
}

OracleResult forward(const Config& c, const OracleInputs& in, const OracleParams& p,
                     const Dims& d, const Vec* fixed_w = nullptr) {
  OracleResult r;
  const Layout l = layout(c, in, d);
  const Vec C = context(c, in, p, d);
  const Vec& E = param(p, "embed_tokens.weight");
  Vec x(size_t(d.B * d.Q * d.H));
  for (int64_t s = 0; s < d.B * d.Q; ++s)
    for (int64_t e = 0; e < d.H; ++e)
      x[size_t(s * d.H + e)] = E[size_t(l.noise[size_t(s)] * d.H + e)];
  for (int64_t i = 0; i < d.layers; ++i) layer(c, in, p, d, l, C, i, x);
  r.student_hidden.assign(x.size(), 0.0);
  for (int64_t s = 0; s < d.B * d.Q; ++s)
    rmsnorm(&x[size_t(s * d.H)], param(p, "norm.weight").data(), d.H, c.drafter.shape.rms_norm_eps,
            &r.student_hidden[size_t(s * d.H)]);
  loss_and_metrics(c, in, p, d, l, r, fixed_w);
  return r;
}

Dims dims(const Config& c, const OracleInputs& in) {
  const auto& s = c.drafter.shape;
  return {in.B,
          in.S,
          in.N,
          c.data.block_size,
          in.N * c.data.block_size,
          s.hidden_size,
          c.target.vocab_size,
          int64_t(c.drafter.target_layer_ids.size()),
          s.num_attention_heads,
          s.num_key_value_heads,
          s.head_dim,
          s.intermediate_size,
          c.drafter.num_hidden_layers};
}

}  // namespace

OracleResult oracle_step(const Config& c, const OracleInputs& in, const OracleParams& p) {
  const Dims d = dims(c, in);
  OracleResult r = forward(c, in, p, d);
  r.anchor_violation = check_anchors(c, in, d);
  return r;
}

double oracle_gradient(const Config& c, const OracleInputs& in, OracleParams p,
                       const std::string& name, size_t index, double rel_step) {
  const Dims d = dims(c, in);
  auto it = p.find(name);
  if (it == p.end() || index >= it->second.size())
    throw std::runtime_error(fmt::format("spec oracle: no entry {} of {}", index, name));
  const Vec w = forward(c, in, p, d).weights;  // D-PACE's, held fixed
  double& x = it->second[index];
  const double v = x, h = rel_step * std::max(1.0, std::abs(v));
  x = v + h;
  const double up = forward(c, in, p, d, &w).loss;
  x = v - h;
  const double down = forward(c, in, p, d, &w).loss;
  return (up - down) / (2 * h);
}

}  // namespace dflash::harness
