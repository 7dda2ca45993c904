#include "harness/memory.h"

#include <algorithm>

#include <fmt/format.h>

namespace dflash::harness {

Formula chunked_loss_bytes(int64_t M, int64_t Ns, int64_t H, int64_t V, int64_t C, bool kl,
                           int64_t e) {
  const double k = kl ? 1 : 0;
  const double fwd = double(Ns * H * e) + (1 + k) * double(C * V * e) + (2 + k) * double(C * H * e) +
                     56.0 * double(M);
  const double bwd = 2.0 * double(Ns * H * e);
  return {std::max(fwd, bwd),
          fmt::format("max(NsHe + (1+kl)CVe + (2+kl)CHe + 56M, 2NsHe) with M={} Ns={} H={} V={} "
                      "C={} kl={} e={}", M, Ns, H, V, C, kl, e)};
}

Formula sparse_attention_bytes(int64_t B, int64_t nh, int64_t nkv, int64_t Q, int64_t S,
                               int64_t hd, int64_t T, int64_t e, int64_t a) {
  const int64_t G = nh / nkv, R = G * Q;
  const double outputs = double(e) * double(2 * B * nh * Q * hd + 2 * B * nkv * (S + Q) * hd) +
                         double(a * B * nh * Q);
  const double head = double(3 * e + 3 * a) * double(R * hd) + 2.0 * a * double((S + Q) * hd) +
                      3.0 * a * double(R * std::min(T, S + Q));
  return {outputs + head,
          fmt::format("e(2B nh Q hd + 2B nkv (S+Q) hd) + a B nh Q + (3e+3a) R hd + 2a (S+Q) hd + "
                      "3a R T with R=G*Q={}", R)};
}

Formula checkpointed_drafter_bytes(int64_t layers, int64_t B, int64_t Q, int64_t S, int64_t H,
                                   int64_t hd, int64_t e) {
  const double bytes = double((layers + 3) * B * Q * H * e) + double(4 * B * S * H * e) +
                       double(2 * B * (S + Q) * hd * e);
  return {bytes, fmt::format("(layers + 3) B Q H e + 4 B S H e + 2 B (S+Q) hd e with layers={}",
                             layers)};
}

}  // namespace dflash::harness
