#include "optimized/sparse_attention.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "optimized/aten_rows.h"
#include "optimized/row_kernels.h"

namespace dflash::optimized {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Geometry {
  int64_t B, nh, nkv, G, Q, S, N, bs, hd, tile;
  double scale;
  at::ScalarType acc;  // fp64 for float64 inputs, else fp32
  Kernels kernels;
  at::TensorOptions opt;                             // q's device, dtype acc
  int64_t rows_per_block() const { return G * bs; }  // R
};

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& anchors, int64_t S,
                  int64_t bs, int64_t tile, Kernels kernels) {
  TORCH_CHECK(
      q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(3) == k.size(3) &&
          k.size(1) >= 1 && q.size(1) % k.size(1) == 0,
      "draft_attention: q (B, nh, Q, hd) and k/v (B, nkv, S+Q, hd) with nh % nkv == 0 expected");
  TORCH_CHECK(q.device() == k.device(), "draft_attention: q on ", q.device(), " but k/v on ",
              k.device());
  TORCH_CHECK(kernels == Kernels::kAten || q.is_cpu(),
              "draft_attention: the host row kernels run on CPU tensors (found ", q.device(),
              "); use optimized.kernels = \"aten\" or \"auto\"");
  TORCH_CHECK(
      anchors.dim() == 2 && anchors.size(0) == q.size(0) && anchors.scalar_type() == at::kLong,
      "draft_attention: anchors must be (B, N) int64");
  TORCH_CHECK(anchors.numel() == 0 ||
                  (anchors.min().item<int64_t>() >= 0 && anchors.max().item<int64_t>() <= S),
              "draft_attention: anchors must lie in [0, S = ", S, "]");
  Geometry g;
  g.B = q.size(0), g.nh = q.size(1), g.Q = q.size(2), g.hd = q.size(3);
  g.nkv = k.size(1), g.G = g.nh / g.nkv, g.S = S, g.N = anchors.size(1), g.bs = bs;
  g.tile = tile, g.scale = 1.0 / std::sqrt(double(g.hd));
  g.acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  g.kernels = kernels;
  g.opt = q.options().dtype(g.acc);
  TORCH_CHECK(g.Q == g.N * bs && k.size(2) == S + g.Q && g.nh % g.nkv == 0,
              "draft_attention: inconsistent shapes");
  return g;
}

// The kept blocks of one (batch row, kv head), sorted by anchor, largest
// first (from CPU copies of anchors and keep; the index tensors then move to
// the device of q): the blocks that see context tile [t0, t0 + tile) are then a prefix,
// so each tile is one GEMM over the stacked query rows of that prefix.
struct Plan {
  std::vector<int64_t> blocks;   // kept block ids, anchor descending
  std::vector<int64_t> anchors;  // their anchors
  at::Tensor rows;               // (K*R) row ids into (nh*Q) for the stacked queries
  at::Tensor limits;             // (K*R) anchor of each stacked row (context keys < it)
  at::Tensor block_ids;          // (K) the blocks, as a tensor
  int64_t prefix_rows(int64_t t0, int64_t R) const {  // rows whose anchor > t0
    return R * int64_t(std::lower_bound(anchors.begin(), anchors.end(), t0,
                                        [](int64_t a, int64_t t) { return a > t; }) -
                       anchors.begin());
  }
};

Plan make_plan(const Geometry& g, const at::Tensor& anchors, const at::Tensor& keep, int64_t b,
               int64_t h) {
  const auto A = anchors.accessor<int64_t, 2>();
  const auto K = keep.accessor<bool, 2>();
  Plan p;
  for (int64_t n = 0; n < g.N; ++n)
    if (K[b][n]) p.blocks.push_back(n);
  std::stable_sort(p.blocks.begin(), p.blocks.end(),
                   [&](int64_t x, int64_t y) { return A[b][x] > A[b][y]; });
  const int64_t R = g.rows_per_block(), nb = int64_t(p.blocks.size());
  p.rows = at::empty({nb * R}, at::kLong);
  p.limits = at::empty({nb * R}, at::kLong);
  int64_t* r = p.rows.data_ptr<int64_t>();
  int64_t* l = p.limits.data_ptr<int64_t>();
  for (int64_t n : p.blocks) {
    p.anchors.push_back(A[b][n]);
    for (int64_t head = h * g.G; head < (h + 1) * g.G; ++head)
      for (int64_t k = 0; k < g.bs; ++k) *r++ = head * g.Q + n * g.bs + k, *l++ = A[b][n];
  }
  p.block_ids = at::tensor(p.blocks, at::kLong);
  if (g.opt.device() != p.rows.device()) {
    p.rows = p.rows.to(g.opt.device()), p.limits = p.limits.to(g.opt.device());
    p.block_ids = p.block_ids.to(g.opt.device());
  }
  return p;
}

constexpr int64_t kRowGrain = 64;
// The row kernels split across threads by rows (no BLAS inside): `kernel`
// gets the rows [b, e) as their own AttentionRows and the byte offset of
// row b in per-row vectors (esz per element).
void for_row_ranges(
    const AttentionRows& a,
    const std::function<void(const AttentionRows&, int64_t b, int64_t esz)>& kernel) {
  const int64_t esz = a.dtype == RowDtype::kFloat64 ? 8 : 4;
  at::parallel_for(0, a.rows, kRowGrain, [&](int64_t b, int64_t e) {
    AttentionRows part = a;
    part.rows = e - b;
    part.scores = static_cast<char*>(a.scores) + b * a.cols * esz;
    if (a.limit) part.limit = a.limit + b;
    kernel(part, b, esz);
  });
}

char* at_row(const at::Tensor& t, int64_t b, int64_t width, int64_t esz) {
  return static_cast<char*>(t.data_ptr()) + b * width * esz;
}

void online_softmax_parallel(const AttentionRows& a, const at::Tensor& m, const at::Tensor& l,
                             const at::Tensor& acc) {
  const int64_t hd = acc.size(-1);
  for_row_ranges(a, [&](const AttentionRows& part, int64_t b, int64_t esz) {
    online_softmax_rows(part, at_row(m, b, 1, esz), at_row(l, b, 1, esz), at_row(acc, b, hd, esz),
                        hd);
  });
}

void softmax_backward_parallel(const AttentionRows& a, const at::Tensor& lse, const at::Tensor& D,
                               const at::Tensor& dp) {
  for_row_ranges(a, [&](const AttentionRows& part, int64_t b, int64_t esz) {
    softmax_backward_rows(part, at_row(lse, b, 1, esz), at_row(D, b, 1, esz),
                          at_row(dp, b, a.cols, esz));
  });
}

RowDtype acc_dtype(const Geometry& g) {
  return g.acc == at::kDouble ? RowDtype::kFloat64 : RowDtype::kFloat32;
}

// The row work of one tile, host kernel or ATen twin: scores s (n, T) (or
// (K, R, bs) for the own blocks), limits the first n rows' key limits
// (undefined: every column visible), t0 the key index of column 0.
void online(const Geometry& g, const at::Tensor& s, const at::Tensor& limits, int64_t t0,
            const at::Tensor& m, const at::Tensor& l, const at::Tensor& acc) {
  const int64_t n = acc.size(0), T = s.numel() / std::max<int64_t>(n, 1);
  if (g.kernels == Kernels::kAten)
    return online_softmax_aten(s.view({n, T}), limits, t0, g.scale, m, l, acc);
  online_softmax_parallel({acc_dtype(g), n, T, s.data_ptr(),
                           limits.defined() ? limits.data_ptr<int64_t>() : nullptr, t0, g.scale},
                          m, l, acc);
}

void softmax_backward(const Geometry& g, const at::Tensor& s, const at::Tensor& limits, int64_t t0,
                      int64_t n, const at::Tensor& lse, const at::Tensor& D, const at::Tensor& dp) {
  const int64_t T = s.numel() / std::max<int64_t>(n, 1);
  if (g.kernels == Kernels::kAten)
    return softmax_backward_aten(s.view({n, T}), limits, t0, g.scale, lse.narrow(0, 0, n),
                                 D.narrow(0, 0, n), dp.view({n, T}));
  softmax_backward_parallel({acc_dtype(g), n, T, s.data_ptr(),
                             limits.defined() ? limits.data_ptr<int64_t>() : nullptr, t0, g.scale},
                            lse, D, dp);
}

at::Tensor mm_acc(const at::Tensor& a, const at::Tensor& b, at::ScalarType acc) {
  return at::matmul(a, b).to(acc).contiguous();
}

// One call's inputs, the anchors and keep on the host: q (B, nh, Q, hd), k
// and v (B, nkv, S+Q, hd), anchors and keep (B, N).
struct HeadInputs {
  at::Tensor q, k, v, anchors, keep;
};
// What forward writes (each head its own rows): out (B, nh, Q, hd) in the
// input dtype, out_acc the same in acc precision (undefined when that is
// the input dtype) and lse (B, nh, Q).
struct ForwardOutputs {
  at::Tensor out, out_acc, lse;
};
// What backward reads (the output in acc precision, lse, the upstream dout
// (B, nh, Q, hd)) and writes (dq, dk, dv, shaped like q, k, v).
struct BackwardTensors {
  at::Tensor out, lse, dout, dq, dk, dv;
};

// Forward of one (batch row, kv head): online softmax over the context tiles
// (a prefix of the stacked rows each), then over each block's own keys. The
// P V product runs in acc precision (fp32 for bf16 inputs): then O is exactly
// sum_j p_j v_j, which backward's D = rowsum(dO o O) relies on to keep the
// softmax Jacobian's rows summing to zero.
void forward_head(const HeadInputs& in, const ForwardOutputs& fw, const Geometry& g, int64_t b,
                  int64_t h) {
  const at::Tensor &q = in.q, &k = in.k, &v = in.v, &anchors = in.anchors, &keep = in.keep;
  const at::Tensor &out = fw.out, &out_acc = fw.out_acc, &lse = fw.lse;
  const Plan p = make_plan(g, anchors, keep, b, h);
  const int64_t R = g.rows_per_block(), K = int64_t(p.blocks.size()), rows = K * R;
  if (K == 0) return;  // every block keep = false: output stays 0
  const at::ScalarType st = q.scalar_type();
  const at::Tensor Qs = q[b].reshape({g.nh * g.Q, g.hd}).index_select(0, p.rows);  // (K*R, hd)
  const at::Tensor Kb = k[b][h], Vb = v[b][h];                                     // (S+Q, hd)
  at::Tensor acc = at::zeros({rows, g.hd}, g.opt);
  at::Tensor m = at::full({rows}, -std::numeric_limits<double>::infinity(), g.opt);
  at::Tensor l = at::zeros({rows}, g.opt);
  for (int64_t t0 = 0; t0 < p.anchors.front(); t0 += g.tile) {
    const int64_t n = p.prefix_rows(t0, R), T = std::min(g.tile, p.anchors.front() - t0);
    at::Tensor s = mm_acc(Qs.narrow(0, 0, n), Kb.narrow(0, t0, T).t(), g.acc);  // (n, T)
    online(g, s, p.limits.narrow(0, 0, n), t0, m.narrow(0, 0, n), l.narrow(0, 0, n),
           acc.narrow(0, 0, n));
    acc.narrow(0, 0, n).add_(mm_acc(s, Vb.narrow(0, t0, T).to(g.acc), g.acc));
  }
  // Own block keys: a batched (K, R, hd) x (K, hd, bs) product.
  const at::Tensor Ko = Kb.narrow(0, g.S, g.Q).view({g.N, g.bs, g.hd}).index_select(0, p.block_ids);
  const at::Tensor Vo = Vb.narrow(0, g.S, g.Q).view({g.N, g.bs, g.hd}).index_select(0, p.block_ids);
  at::Tensor s = mm_acc(Qs.view({K, R, g.hd}), Ko.transpose(1, 2), g.acc);  // (K, R, bs)
  online(g, s, at::Tensor(), 0, m, l, acc);
  acc.add_(mm_acc(s, Vo.to(g.acc), g.acc).view({rows, g.hd}));
  const at::Tensor o = acc / l.unsqueeze(1);  // (K*R, hd) in acc precision
  out[b].view({g.nh * g.Q, g.hd}).index_copy_(0, p.rows, o.to(st));
  if (out_acc.defined()) out_acc[b].view({g.nh * g.Q, g.hd}).index_copy_(0, p.rows, o);
  lse[b].view({g.nh * g.Q}).index_copy_(0, p.rows, m + l.log());
}

// Backward of one (batch row, kv head); it owns that head's dK and dV rows.
// `out` is the output in acc precision. For bf16 inputs dP = dO V^T is also
// formed in fp32, so that dS = p (dP - D) with D = rowsum(dO o O) cancels as
// the reference's p (dp - sum p dp) does; from two separately rounded bf16
// quantities the difference would keep their rounding errors.
void backward_head(const HeadInputs& in, const BackwardTensors& bw, const Geometry& g, int64_t b,
                   int64_t h) {
  const at::Tensor &q = in.q, &k = in.k, &v = in.v, &anchors = in.anchors, &keep = in.keep;
  const at::Tensor &out = bw.out, &lse = bw.lse, &dout = bw.dout;
  const at::Tensor &dq = bw.dq, &dk = bw.dk, &dv = bw.dv;
  const Plan p = make_plan(g, anchors, keep, b, h);
  const int64_t R = g.rows_per_block(), K = int64_t(p.blocks.size()), rows = K * R;
  if (K == 0) return;
  const at::ScalarType st = q.scalar_type();
  auto stacked = [&](const at::Tensor& x) {
    return x[b].reshape({g.nh * g.Q, g.hd}).index_select(0, p.rows);  // (K*R, hd)
  };
  const at::Tensor Qs = stacked(q), dO = stacked(dout);
  const at::Tensor D = (dO.to(g.acc) * stacked(out).to(g.acc)).sum(1);           // (K*R)
  const at::Tensor L = lse[b].reshape(-1).index_select(0, p.rows).contiguous();  // (K*R)
  const at::Tensor Kb = k[b][h], Vb = v[b][h];
  at::Tensor dQ = at::zeros({rows, g.hd}, g.opt);
  at::Tensor dK = at::zeros({g.S + g.Q, g.hd}, g.opt), dV = at::zeros_like(dK);
  auto tile = [&](const at::Tensor& Qt, const at::Tensor& dOt, const at::Tensor& Kt,
                  const at::Tensor& Vt, int64_t n, const at::Tensor& limits, int64_t t0,
                  at::Tensor dQt, at::Tensor dKt, at::Tensor dVt) {
    at::Tensor s = mm_acc(Qt, Kt.transpose(-1, -2), g.acc);                        // (.., n, T)
    at::Tensor dP = mm_acc(dOt.to(g.acc), Vt.to(g.acc).transpose(-1, -2), g.acc);  // (.., n, T)
    softmax_backward(g, s, limits, t0, n, L, D, dP);
    const at::Tensor dS = dP.to(st);
    dVt.add_(mm_acc(s.to(st).transpose(-1, -2), dOt, g.acc));
    dQt.add_(mm_acc(dS, Kt, g.acc), g.scale);
    dKt.add_(mm_acc(dS.transpose(-1, -2), Qt, g.acc), g.scale);
  };
  for (int64_t t0 = 0; t0 < p.anchors.front(); t0 += g.tile) {
    const int64_t n = p.prefix_rows(t0, R), T = std::min(g.tile, p.anchors.front() - t0);
    tile(Qs.narrow(0, 0, n), dO.narrow(0, 0, n), Kb.narrow(0, t0, T), Vb.narrow(0, t0, T), n,
         p.limits.narrow(0, 0, n), t0, dQ.narrow(0, 0, n), dK.narrow(0, t0, T),
         dV.narrow(0, t0, T));
  }
  // Own blocks, batched; their dK/dV rows are scattered back by block id.
  auto own = [&](const at::Tensor& x) {
    return x.narrow(0, g.S, g.Q).view({g.N, g.bs, g.hd}).index_select(0, p.block_ids);
  };
  at::Tensor dKo = at::zeros({K, g.bs, g.hd}, g.opt), dVo = at::zeros_like(dKo);
  tile(Qs.view({K, R, g.hd}), dO.view({K, R, g.hd}), own(Kb), own(Vb), rows, at::Tensor(), 0,
       dQ.view({K, R, g.hd}), dKo, dVo);
  dK.narrow(0, g.S, g.Q).view({g.N, g.bs, g.hd}).index_add_(0, p.block_ids, dKo);
  dV.narrow(0, g.S, g.Q).view({g.N, g.bs, g.hd}).index_add_(0, p.block_ids, dVo);
  dq[b].view({g.nh * g.Q, g.hd}).index_copy_(0, p.rows, dQ.to(st));
  dk[b][h].copy_(dK);
  dv[b][h].copy_(dV);
}

struct SparseAttention : public torch::autograd::Function<SparseAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& anchors, const at::Tensor& keep,
                            int64_t S, int64_t bs, int64_t tile, Kernels kernels) {
    const DraftAttentionForward f =
        draft_attention_forward(q, k, v, anchors, keep, S, bs, tile, kernels);
    ctx->save_for_backward({q.contiguous(), k.contiguous(), v.contiguous(),
                            f.out_acc.defined() ? f.out_acc : f.out, f.lse, anchors, keep});
    ctx->saved_data["S"] = S;
    ctx->saved_data["bs"] = bs;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["kernels"] = int64_t(kernels);
    return f.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const DraftAttentionGrads g = draft_attention_backward(
        grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["S"].toInt(),
        ctx->saved_data["bs"].toInt(), ctx->saved_data["tile"].toInt(),
        Kernels(ctx->saved_data["kernels"].toInt()));
    return {g.dq, g.dk, g.dv, {}, {}, {}, {}, {}, {}};
  }
};

}  // namespace

DraftAttentionForward draft_attention_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                              const at::Tensor& v_in, const at::Tensor& anchors,
                                              const at::Tensor& keep, int64_t S, int64_t bs,
                                              int64_t tile, Kernels kernels) {
  TORCH_CHECK(tile >= 1, "draft_attention: tile must be >= 1");
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Geometry g = geometry(q, k, anchors, S, bs, tile, kernels);
  TORCH_CHECK(v.sizes() == k.sizes(), "draft_attention: v must have k's shape");
  TORCH_CHECK(keep.sizes() == anchors.sizes() && keep.scalar_type() == at::kBool,
              "draft_attention: keep must be (B, N) bool, like anchors");
  DraftAttentionForward f;
  f.out = at::zeros_like(q);  // keep = false blocks stay exactly 0
  if (q.scalar_type() != g.acc) f.out_acc = at::zeros(q.sizes(), g.opt);
  f.lse = at::zeros({g.B, g.nh, g.Q}, g.opt);
  const at::Tensor anchors_h = anchors.cpu(), keep_h = keep.cpu();
  const HeadInputs in{q, k, v, anchors_h, keep_h};
  for (int64_t i = 0; i < g.B * g.nkv; ++i)
    forward_head(in, {f.out, f.out_acc, f.lse}, g, i / g.nkv, i % g.nkv);
  return f;
}

DraftAttentionGrads draft_attention_backward(const at::Tensor& dout_in, const at::Tensor& q_in,
                                             const at::Tensor& k_in, const at::Tensor& v_in,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& anchors, const at::Tensor& keep,
                                             int64_t S, int64_t bs, int64_t tile, Kernels kernels) {
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Geometry g = geometry(q, k, anchors, S, bs, tile, kernels);
  const at::Tensor dout = dout_in.contiguous();  // the real, per-element upstream gradient
  DraftAttentionGrads r{at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};
  const at::Tensor anchors_h = anchors.cpu(), keep_h = keep.cpu();
  const HeadInputs in{q, k, v, anchors_h, keep_h};
  for (int64_t i = 0; i < g.B * g.nkv; ++i)
    backward_head(in, {out.contiguous(), lse.contiguous(), dout, r.dq, r.dk, r.dv}, g, i / g.nkv,
                  i % g.nkv);
  return r;
}

at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t S, int64_t bs, int64_t tile, Kernels kernels) {
  return SparseAttention::apply(q, k, v, a.anchors.contiguous(), a.keep.contiguous(), S, bs, tile,
                                kernels);
}

at::Tensor draft_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t S, int64_t bs) {
  return draft_attention(q, k, v, a, S, bs, kDefaultAttentionTile);
}

}  // namespace dflash::optimized
