// Batch construction shared by both builds, so reference and optimized always
// see identical anchors, noise ids, labels and loss weights (SPEC.md steps
// 2, 3, 5, 8). Randomness comes from an explicit, portable generator.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <string>

namespace dflash {

// std::mt19937_64 (its output sequence is fixed by the C++ standard) with our
// own uniform and normal draws, so a seed gives the same numbers with any
// standard library and any libtorch version.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t next() { return g_(); }
  uint64_t below(uint64_t n);  // uniform integer in [0, n), n > 0
  double uniform();            // [0, 1), 53 random bits
  double normal();             // N(0, 1), Box-Muller

 private:
  std::mt19937_64 g_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// Independent seed for a named stream ("anchors", "batch", a parameter name)
// and index (step, row): splitmix64 over the seed and an FNV-1a name hash.
uint64_t derive_seed(uint64_t seed, const std::string& stream, uint64_t index = 0);

struct Anchors {
  at::Tensor anchors;  // (B, N) int64: kept anchors ascending, then padding 0
  at::Tensor keep;     // (B, N) bool: false on padding
  int64_t num_anchors() const { return anchors.size(1); }  // N
};

// SPEC step 2. Candidates of row b: a <= S-2 with loss_mask[a] && loss_mask[a+1].
// N = min(max_anchors, largest candidate count in the batch). A row with more
// than N candidates draws N without replacement (partial Fisher-Yates on
// `rng`, rows in order) and sorts them; a row with at most N keeps all of its
// candidates (no draw) and pads with anchor 0, keep = false.
Anchors sample_anchors(const at::Tensor& loss_mask,  // (B, S) bool
                       int64_t max_anchors, Rng& rng);

// Per draft slot (n, k), flattened to q = n * bs + k.
struct DraftLayout {
  int64_t block_size = 0;    // bs
  at::Tensor noise_ids;      // (B, Q) int64: anchor token at k = 0 if kept, else MASK
  at::Tensor positions;      // (B, Q) int64: anchor_n + k (RoPE position)
  at::Tensor labels;         // (B, Q) int64: input_ids[anchor_n + k], clamped in range
  at::Tensor teacher_index;  // (B, Q) int64: anchor_n + k - 1 clamped to [0, S-1]
  at::Tensor counted;        // (B, Q) bool: w > 0 before decay
  at::Tensor weights;        // (B, Q) float64: w of SPEC step 8, decay included
};

DraftLayout make_draft_layout(const at::Tensor& input_ids,  // (B, S) int64
                              const at::Tensor& loss_mask,  // (B, S) bool
                              const Anchors& anchors, int64_t block_size, int64_t mask_token_id,
                              double gamma);

// SPEC step 10 from per-slot hits (counted and argmax == label), shared by
// both builds so they count identically.
struct SlotMetrics {
  at::Tensor correct;      // (bs) int64
  at::Tensor counted;      // (bs) int64
  at::Tensor accept_sum;   // () int64, leading correct counted slots k >= 1 per kept block
  at::Tensor kept_blocks;  // () int64
};
SlotMetrics slot_metrics(const at::Tensor& hit,  // (B, Q) bool
                         const DraftLayout& layout, const Anchors& a);

// Loss decay for slot k: exp(-max(k-1, 0) / gamma), 1 when gamma == 0.
double slot_decay(int64_t k, double gamma);

}  // namespace dflash
