// Analytic working sets of the optimized components: the ceilings that the
// allocator probe (core/alloc_probe.h) must stay under, and (later) the
// planner's per-component figures. Each returns bytes above what was live on
// entry (inputs are the caller's), for one forward + backward.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::harness {

struct Formula {
  double bytes;
  std::string text;  // the formula, for reports
};

// Fused chunked loss: M weighted rows of Ns student rows, hidden H, vocab V,
// chunk C (C <= M), element size e (bytes), KL on or off.
//   forward : gradient Ns*H*e + logits chunks (1 + kl)*C*V*e + row chunks
//             (2 + kl)*C*H*e + per-row vectors 7*8*M
//   backward: the saved gradient and the scaled copy, 2*Ns*H*e
Formula chunked_loss_bytes(int64_t M, int64_t Ns, int64_t H, int64_t V, int64_t C, bool kl,
                           int64_t e);

// Block-sparse attention, forward + backward. B, nh, nkv, Q = N*bs, S, hd,
// key tile T, element size e, accumulation size a (4, or 8 for float64).
// R = G*Q stacked query rows per kv head at most (G = nh/nkv).
//   outputs : out + lse, dq + dk + dv (e * (2*B*nh*Q*hd + 2*B*nkv*(S+Q)*hd)) + a*B*nh*Q
//   per head: stacked rows (3*e + 3*a)*R*hd, dK and dV accumulators
//             2*a*(S+Q)*hd, two score tiles 3*a*R*T
Formula sparse_attention_bytes(int64_t B, int64_t nh, int64_t nkv, int64_t Q, int64_t S,
                               int64_t hd, int64_t T, int64_t e, int64_t a);

// What a checkpointed drafter forward keeps for backward: the input of every
// layer and the output ((layers + 1) B Q H e), the embeddings and the final
// norm's saved input (2 B Q H e), the context projection with its norm
// (4 B S H e) and the RoPE tables of the keys (2 B (S+Q) hd e).
Formula checkpointed_drafter_bytes(int64_t layers, int64_t B, int64_t Q, int64_t S, int64_t H,
                                   int64_t hd, int64_t e);

}  // namespace dflash::harness
