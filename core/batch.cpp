#include "core/batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/hash.h"

namespace dflash {

uint64_t Rng::below(uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below(0)");
  // Rejection sampling: uniform without modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = g_();
  while (x >= limit);
  return x % n;
}

double Rng::uniform() { return double(g_() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1;
  do u1 = uniform();
  while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2.0 * M_PI * u2);
  has_spare_ = true;
  return r * std::cos(2.0 * M_PI * u2);
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t derive_seed(uint64_t seed, const std::string& stream, uint64_t index) {
  const uint64_t h = fnv1a64(stream);
  return splitmix64(splitmix64(splitmix64(seed) ^ h) ^ index);
}

Anchors sample_anchors(const at::Tensor& loss_mask, int64_t max_anchors, Rng& rng) {
  TORCH_CHECK(loss_mask.dim() == 2 && loss_mask.scalar_type() == at::kBool,
              "sample_anchors: loss_mask must be (B, S) bool");
  TORCH_CHECK(max_anchors >= 1, "sample_anchors: max_anchors must be >= 1");
  const at::Tensor m = loss_mask.contiguous();
  const int64_t B = m.size(0), S = m.size(1);
  const bool* p = m.data_ptr<bool>();
  std::vector<std::vector<int64_t>> cand(static_cast<size_t>(B));
  size_t most = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t a = 0; a + 1 < S; ++a)
      if (p[b * S + a] && p[b * S + a + 1]) cand[size_t(b)].push_back(a);
    most = std::max(most, cand[size_t(b)].size());
  }
  const int64_t N = std::min<int64_t>(max_anchors, int64_t(most));
  at::Tensor anchors = at::zeros({B, N}, at::kLong);  // (B, N)
  at::Tensor keep = at::zeros({B, N}, at::kBool);     // (B, N)
  auto A = anchors.accessor<int64_t, 2>();
  auto K = keep.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t>& c = cand[size_t(b)];
    if (int64_t(c.size()) > N) {
      for (int64_t i = 0; i < N; ++i)  // partial Fisher-Yates: c[0..N) uniform
        std::swap(c[size_t(i)], c[size_t(i + int64_t(rng.below(c.size() - size_t(i))))]);
      c.resize(size_t(N));
      std::sort(c.begin(), c.end());
    }
    for (size_t i = 0; i < c.size(); ++i) {
      A[b][int64_t(i)] = c[i];
      K[b][int64_t(i)] = true;
    }
  }
  return {anchors, keep};
}

SlotMetrics slot_metrics(const at::Tensor& hit, const DraftLayout& l, const Anchors& a) {
  const int64_t B = hit.size(0), N = a.num_anchors(), bs = l.block_size;
  const at::Tensor h = (hit & l.counted).view({B, N, bs});  // (B, N, bs)
  SlotMetrics m;
  m.correct = h.sum(at::IntArrayRef{0, 1}).to(at::kLong);                           // (bs)
  m.counted = l.counted.view({B, N, bs}).sum(at::IntArrayRef{0, 1}).to(at::kLong);  // (bs)
  // Accepted length of a block: slots 1, 2, ... while counted and correct.
  const at::Tensor run = h.narrow(2, 1, bs - 1).to(at::kLong).cumprod(2);  // (B, N, bs-1)
  m.accept_sum = (run.sum(2) * a.keep).sum().to(at::kLong);
  m.kept_blocks = a.keep.sum().to(at::kLong);
  return m;
}

double slot_decay(int64_t k, double gamma) {
  if (gamma == 0.0) return 1.0;
  return std::exp(-double(std::max<int64_t>(k - 1, 0)) / gamma);
}

DraftLayout make_draft_layout(const at::Tensor& input_ids, const at::Tensor& loss_mask,
                              const Anchors& a, int64_t bs, int64_t mask_token_id, double gamma) {
  const int64_t B = input_ids.size(0), S = input_ids.size(1), N = a.num_anchors();
  const int64_t Q = N * bs;
  at::Tensor k = at::arange(bs, input_ids.options());       // (bs) on the batch's device
  at::Tensor pos = a.anchors.unsqueeze(-1) + k;             // (B, N, bs)
  at::Tensor in_range = pos < S;                            // (B, N, bs)
  at::Tensor pos_c = pos.clamp_max(S - 1).reshape({B, Q});  // (B, Q)
  at::Tensor mask_at = loss_mask.gather(1, pos_c).reshape({B, N, bs});
  at::Tensor counted = a.keep.unsqueeze(-1) & in_range & (k > 0) & mask_at;  // (B, N, bs)

  std::vector<double> decay(static_cast<size_t>(bs));
  for (int64_t i = 0; i < bs; ++i) decay[size_t(i)] = slot_decay(i, gamma);
  at::Tensor decay_t = at::tensor(decay, at::kDouble).to(input_ids.device());  // (bs)

  at::Tensor noise = at::full({B, N, bs}, mask_token_id, input_ids.options());
  at::Tensor anchor_tok = input_ids.gather(1, a.anchors);  // (B, N)
  noise.select(2, 0).copy_(at::where(a.keep, anchor_tok, at::full_like(anchor_tok, mask_token_id)));

  DraftLayout l;
  l.block_size = bs;
  l.noise_ids = noise.reshape({B, Q});
  l.positions = pos.reshape({B, Q});
  l.labels = input_ids.gather(1, pos_c);
  l.teacher_index = (pos - 1).clamp(0, S - 1).reshape({B, Q});
  l.counted = counted.reshape({B, Q});
  l.weights = (counted.to(at::kDouble) * decay_t).reshape({B, Q});
  return l;
}

}  // namespace dflash
