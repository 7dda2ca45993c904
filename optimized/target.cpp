// Query-chunked causal attention for the target forward.
#include "optimized/target.h"

#include "reference/layers.h"

namespace dflash::optimized {

at::Tensor chunked_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    int64_t query_chunk) {
  TORCH_CHECK(query_chunk >= 1, "chunked_causal_attention: query_chunk must be >= 1");
  const int64_t B = q.size(0), S = q.size(2);
  std::vector<at::Tensor> out;
  for (int64_t q0 = 0; q0 < S; q0 += query_chunk) {
    const int64_t n = std::min(query_chunk, S - q0), kend = q0 + n;  // keys [0, kend)
    // Row i of the chunk is query q0 + i: keys j <= q0 + i.
    const at::Tensor visible =
        at::ones({n, kend}, q.options().dtype(at::kBool)).tril(q0).expand({B, n, kend});
    out.push_back(reference::masked_attention(q.narrow(2, q0, n), k.narrow(2, 0, kend),
                                              v.narrow(2, 0, kend), visible));  // (B, nh, n, hd)
  }
  return out.size() == 1 ? out[0] : at::cat(out, 2);
}

reference::TargetOutputs target_forward(const Config& c, const TargetWeights& w,
                                        const at::Tensor& input_ids) {
  const int64_t chunk = c.optimized.target_query_chunk;
  if (chunk <= 0) return reference::target_forward(c, w, input_ids);
  return reference::target_forward_with(
      c, w, input_ids, [chunk](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return chunked_causal_attention(q, k, v, chunk);
      });
}

}  // namespace dflash::optimized
