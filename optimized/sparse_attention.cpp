#include "optimized/sparse_attention.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

namespace dflash::optimized {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Geometry {
  int64_t B, nh, nkv, G, Q, S, N, bs, hd, tile;
  double scale;
  at::ScalarType acc;  // fp64 for float64 inputs, else fp32
};

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& anchors,
                  int64_t S, int64_t bs, int64_t tile) {
  Geometry g;
  g.B = q.size(0), g.nh = q.size(1), g.Q = q.size(2), g.hd = q.size(3);
  g.nkv = k.size(1), g.G = g.nh / g.nkv, g.S = S, g.N = anchors.size(1), g.bs = bs;
  g.tile = tile, g.scale = 1.0 / std::sqrt(double(g.hd));
  g.acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(g.Q == g.N * bs && k.size(2) == S + g.Q && g.nh % g.nkv == 0,
              "draft_attention: inconsistent shapes");
  return g;
}

// The visible key ranges of a block: context tiles up to the anchor, then the
// block's own keys.
template <typename F>
void for_each_tile(const Geometry& g, int64_t anchor, int64_t n, F&& f) {
  for (int64_t t0 = 0; t0 < anchor; t0 += g.tile) f(t0, std::min(g.tile, anchor - t0));
  f(g.S + n * g.bs, g.bs);
}

// (G*bs, hd) rows of block n for the query heads of kv head h, from x (nh, Q, hd).
at::Tensor block_rows(const at::Tensor& x, const Geometry& g, int64_t h, int64_t n) {
  return x.narrow(0, h * g.G, g.G).narrow(1, n * g.bs, g.bs).reshape({g.G * g.bs, g.hd});
}

at::Tensor mm_acc(const at::Tensor& a, const at::Tensor& b, at::ScalarType acc) {
  return at::mm(a, b).to(acc).contiguous();
}

// One tile of the online softmax: s (R, T) raw scores in, exp(scale*s - m_new)
// out; m, l and the accumulator rows are rescaled for the new maxima.
template <typename acc_t>
void online_softmax_tile(acc_t* s, int64_t R, int64_t T, acc_t scale, acc_t* m, acc_t* l,
                         acc_t* acc, int64_t hd) {
  for (int64_t i = 0; i < R; ++i) {
    acc_t* row = s + i * T;
    acc_t mt = -std::numeric_limits<acc_t>::infinity();
    for (int64_t j = 0; j < T; ++j) mt = std::max(mt, scale * row[j]);
    const acc_t m_new = std::max(m[i], mt);
    const acc_t alpha = std::exp(m[i] - m_new);  // 0 on the first tile (m = -inf)
    acc_t sum = 0;
    for (int64_t j = 0; j < T; ++j) sum += (row[j] = std::exp(scale * row[j] - m_new));
    l[i] = l[i] * alpha + sum;
    for (int64_t d = 0; d < hd; ++d) acc[i * hd + d] *= alpha;
    m[i] = m_new;
  }
}

template <typename acc_t>
void forward_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                   at::Tensor& lse, const Geometry& g, int64_t b, int64_t h, int64_t n,
                   int64_t anchor) {
  const int64_t R = g.G * g.bs;
  const at::Tensor Qg = block_rows(q[b], g, h, n);                  // (R, hd)
  const at::Tensor Kb = k[b][h], Vb = v[b][h];                      // (S+Q, hd)
  at::Tensor acc = at::zeros({R, g.hd}, g.acc);                     // (R, hd)
  at::Tensor m = at::full({R}, -std::numeric_limits<double>::infinity(), g.acc);
  at::Tensor l = at::zeros({R}, g.acc);
  for_each_tile(g, anchor, n, [&](int64_t t0, int64_t T) {
    at::Tensor s = mm_acc(Qg, Kb.narrow(0, t0, T).t(), g.acc);      // (R, T)
    online_softmax_tile<acc_t>(s.data_ptr<acc_t>(), R, T, acc_t(g.scale), m.data_ptr<acc_t>(),
                               l.data_ptr<acc_t>(), acc.data_ptr<acc_t>(), g.hd);
    acc.add_(mm_acc(s.to(v.scalar_type()), Vb.narrow(0, t0, T), g.acc));
  });
  out[b].narrow(0, h * g.G, g.G).narrow(1, n * g.bs, g.bs)
      .copy_((acc / l.unsqueeze(1)).view({g.G, g.bs, g.hd}));
  lse[b].narrow(0, h * g.G, g.G).narrow(1, n * g.bs, g.bs)
      .copy_((m + l.log()).view({g.G, g.bs}));
}

template <typename acc_t>
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& anchors, const at::Tensor& keep, at::Tensor& out, at::Tensor& lse,
             const Geometry& g) {
  const auto A = anchors.accessor<int64_t, 2>();
  const auto K = keep.accessor<bool, 2>();
  at::parallel_for(0, g.B * g.nkv * g.N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / (g.nkv * g.N), h = (i / g.N) % g.nkv, n = i % g.N;
      if (K[b][n]) forward_block<acc_t>(q, k, v, out, lse, g, b, h, n, A[b][n]);
    }
  });
}

// p = exp(scale*s - lse) in place; then, given dP (R, T), dS = p * (dP - D) in dP.
template <typename acc_t>
void probs_and_dscores(acc_t* s, acc_t* dp, const acc_t* lse, const acc_t* D, int64_t R,
                       int64_t T, acc_t scale) {
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < T; ++j) {
      const acc_t p = std::exp(scale * s[i * T + j] - lse[i]);
      s[i * T + j] = p;
      dp[i * T + j] = p * (dp[i * T + j] - D[i]);
    }
}

template <typename acc_t>
void backward_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                    at::Tensor& dq, at::Tensor& dk_acc, at::Tensor& dv_acc, const Geometry& g,
                    int64_t b, int64_t h, int64_t n, int64_t anchor) {
  const at::ScalarType st = q.scalar_type();
  const at::Tensor Qg = block_rows(q[b], g, h, n), dO = block_rows(dout[b], g, h, n);  // (R, hd)
  const at::Tensor D = (dO.to(g.acc) * block_rows(out[b], g, h, n).to(g.acc)).sum(1);  // (R)
  const at::Tensor L = lse[b].narrow(0, h * g.G, g.G).narrow(1, n * g.bs, g.bs).reshape(-1).contiguous();
  const at::Tensor Kb = k[b][h], Vb = v[b][h];
  at::Tensor dQ = at::zeros({g.G * g.bs, g.hd}, g.acc);
  for_each_tile(g, anchor, n, [&](int64_t t0, int64_t T) {
    const at::Tensor Kt = Kb.narrow(0, t0, T), Vt = Vb.narrow(0, t0, T);
    at::Tensor s = mm_acc(Qg, Kt.t(), g.acc);                        // (R, T)
    at::Tensor dP = mm_acc(dO, Vt.t(), g.acc);                       // (R, T)
    probs_and_dscores<acc_t>(s.data_ptr<acc_t>(), dP.data_ptr<acc_t>(), L.data_ptr<acc_t>(),
                             D.data_ptr<acc_t>(), s.size(0), T, acc_t(g.scale));
    dv_acc.narrow(0, t0, T).add_(mm_acc(s.to(st).t(), dO, g.acc));  // p^T dO
    const at::Tensor dS = dP.to(st);
    dQ.add_(mm_acc(dS, Kt, g.acc), g.scale);
    dk_acc.narrow(0, t0, T).add_(mm_acc(dS.t(), Qg, g.acc), g.scale);
  });
  dq[b].narrow(0, h * g.G, g.G).narrow(1, n * g.bs, g.bs).copy_(dQ.view({g.G, g.bs, g.hd}));
}

// Parallel over (batch row, kv head): each owns its dK/dV rows, so blocks
// accumulate into them without races.
template <typename acc_t>
void backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
              const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& anchors,
              const at::Tensor& keep, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
              const Geometry& g) {
  const auto A = anchors.accessor<int64_t, 2>();
  const auto K = keep.accessor<bool, 2>();
  at::parallel_for(0, g.B * g.nkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / g.nkv, h = i % g.nkv;
      at::Tensor dk_acc = at::zeros({g.S + g.Q, g.hd}, g.acc), dv_acc = at::zeros_like(dk_acc);
      for (int64_t n = 0; n < g.N; ++n)
        if (K[b][n]) backward_block<acc_t>(q, k, v, out, lse, dout, dq, dk_acc, dv_acc, g, b, h, n, A[b][n]);
      dk[b][h].copy_(dk_acc);
      dv[b][h].copy_(dv_acc);
    }
  });
}

struct SparseAttention : public torch::autograd::Function<SparseAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, const at::Tensor& anchors,
                            const at::Tensor& keep, int64_t S, int64_t bs, int64_t tile) {
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Geometry g = geometry(q, k, anchors, S, bs, tile);
    at::Tensor out = at::zeros_like(q);  // keep = false blocks stay exactly 0
    at::Tensor lse = at::zeros({g.B, g.nh, g.Q}, g.acc);
    if (g.acc == at::kDouble) optimized::forward<double>(q, k, v, anchors, keep, out, lse, g);
    else optimized::forward<float>(q, k, v, anchors, keep, out, lse, g);
    ctx->save_for_backward({q, k, v, out, lse, anchors, keep});
    ctx->saved_data["S"] = S;
    ctx->saved_data["bs"] = bs;
    ctx->saved_data["tile"] = tile;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    const Geometry g = geometry(q, k, s[5], ctx->saved_data["S"].toInt(),
                                ctx->saved_data["bs"].toInt(), ctx->saved_data["tile"].toInt());
    const at::Tensor dout = grads[0].contiguous();  // the real, per-element upstream gradient
    at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    if (g.acc == at::kDouble) optimized::backward<double>(q, k, v, out, lse, dout, s[5], s[6], dq, dk, dv, g);
    else optimized::backward<float>(q, k, v, out, lse, dout, s[5], s[6], dq, dk, dv, g);
    return {dq, dk, dv, {}, {}, {}, {}, {}};
  }
};

}  // namespace

at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t S, int64_t bs, int64_t tile) {
  TORCH_CHECK(tile >= 1, "draft_attention: tile must be >= 1");
  return SparseAttention::apply(q, k, v, a.anchors.contiguous(), a.keep.contiguous(), S, bs, tile);
}

at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t S, int64_t bs) {
  return draft_attention(q, k, v, a, S, bs, kDefaultAttentionTile);
}

}  // namespace dflash::optimized
