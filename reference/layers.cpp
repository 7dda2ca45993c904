#include "reference/layers.h"

#include <cmath>

namespace dflash::reference {

namespace {
at::ScalarType accum_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }
}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(accum_type(x.scalar_type()));      // (..., D)
  const at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);  // (..., 1)
  return weight * (xf * at::rsqrt(var + eps)).to(x.scalar_type());
}

namespace {
// Llama 3.1's frequency rescaling (transformers' _compute_llama3_parameters):
// wavelengths longer than original/low_freq_factor are slowed by `factor`,
// shorter than original/high_freq_factor kept, those between interpolated.
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const RopeScaling& r) {  // (hd/2)
  const double old_len = double(r.original_max_position_embeddings);
  const double low_wavelen = old_len / r.low_freq_factor,
               high_wavelen = old_len / r.high_freq_factor;
  const at::Tensor wavelen = (2.0 * M_PI) / inv_freq;  // (hd/2)
  const at::Tensor slowed = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth =
      (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = (1.0 - smooth) * slowed / r.factor + smooth * slowed;
  const at::Tensor medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
  return at::where(medium, smoothed, slowed);
}
}  // namespace

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& positions, const LayerShape& s,
                                               at::ScalarType dtype) {
  const int64_t hd = s.head_dim;
  const at::Tensor i = at::arange(0, hd, 2, positions.options().dtype(at::kDouble));  // (hd/2)
  at::Tensor inv_freq = at::pow(s.rope_theta, -i / double(hd));                       // (hd/2)
  if (s.rope_scaling.type == "llama3") inv_freq = llama3_inv_freq(inv_freq, s.rope_scaling);
  const at::Tensor angles = positions.to(at::kDouble).unsqueeze(-1) * inv_freq;  // (..., hd/2)
  const at::Tensor emb = at::cat({angles, angles}, -1);                          // (..., hd)
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor swiglu_mlp(const at::Tensor& x, const DecoderLayerWeights& w) {
  return project(at::silu(project(x, w.gate_proj)) * project(x, w.up_proj), w.down_proj);
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& visible) {
  const int64_t nh = q.size(1), nkv = k.size(1), hd = q.size(-1);
  const int64_t group = nh / nkv;
  const at::Tensor kr = k.repeat_interleave(group, 1);  // (B, nh, Tk, hd)
  const at::Tensor vr = v.repeat_interleave(group, 1);  // (B, nh, Tk, hd)
  const at::ScalarType acc = accum_type(q.scalar_type());
  at::Tensor scores = at::matmul(q, kr.transpose(-1, -2)).to(acc) *
                      (1.0 / std::sqrt(double(hd)));     // (B, nh, Tq, Tk)
  const at::Tensor vis = visible.unsqueeze(1);           // (B, 1, Tq, Tk)
  const at::Tensor any = vis.any(-1, /*keepdim=*/true);  // (B, 1, Tq, 1)
  // Invisible keys get -inf; a row with no visible key is zeroed before the
  // softmax (finite, so no NaN in forward or backward) and its probabilities
  // are then multiplied by the all-false mask: its output is exactly 0.
  scores = scores.masked_fill(vis.logical_not(), -INFINITY).masked_fill(any.logical_not(), 0.0);
  const at::Tensor probs = at::softmax(scores, -1) * vis.to(acc);  // (B, nh, Tq, Tk)
  return at::matmul(probs.to(v.scalar_type()), vr);                // (B, nh, Tq, hd)
}

at::Tensor normed_heads(const at::Tensor& x, const at::Tensor& proj, const at::Tensor& norm,
                        int64_t heads, int64_t hd, double eps) {
  const at::Tensor y = project(x, proj);                  // (B, T, heads*hd)
  if (!norm.defined()) return split_heads(y, heads, hd);  // Llama: no q/k norm
  return rms_norm(y.view({y.size(0), y.size(1), heads, hd}), norm, eps).transpose(1, 2);
}

at::Tensor split_heads(const at::Tensor& x, int64_t heads, int64_t hd) {
  return x.reshape({x.size(0), x.size(1), heads, hd}).transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

}  // namespace dflash::reference
