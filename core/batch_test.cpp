// Anchor sampling properties (RapidCheck) and hand-computed draft layouts
// (labels, loss weights, decay, k = 0, positions past S, loss-mask holes).
#include "core/batch.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <set>

namespace dflash {
namespace {

struct MaskCase {
  at::Tensor mask;  // (B, S) bool
  int64_t max_anchors;
};

// Loss masks with holes, all-false rows and dense rows.
rc::Gen<MaskCase> gen_mask_case() {
  return rc::gen::exec([] {
    const int64_t B = *rc::gen::inRange<int64_t>(1, 5);
    const int64_t S = *rc::gen::inRange<int64_t>(2, 40);
    at::Tensor m = at::zeros({B, S}, at::kBool);
    for (int64_t b = 0; b < B; ++b) {
      const int density = *rc::gen::inRange(0, 11);  // 0: no candidates
      for (int64_t s = 0; s < S; ++s) m[b][s] = *rc::gen::inRange(0, 10) < density;
    }
    return MaskCase{m, *rc::gen::inRange<int64_t>(1, 24)};
  });
}

std::vector<std::vector<int64_t>> candidates(const at::Tensor& m) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(m.size(0)));
  for (int64_t b = 0; b < m.size(0); ++b)
    for (int64_t a = 0; a + 1 < m.size(1); ++a)
      if (m[b][a].item<bool>() && m[b][a + 1].item<bool>()) out[size_t(b)].push_back(a);
  return out;
}

RC_GTEST_PROP(Anchors, FollowTheSpecRule, ()) {
  const MaskCase mc = *gen_mask_case();
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  Rng rng(seed);
  const Anchors a = sample_anchors(mc.mask, mc.max_anchors, rng);
  const auto cand = candidates(mc.mask);
  size_t most = 0;
  for (const auto& c : cand) most = std::max(most, c.size());
  const int64_t N = std::min<int64_t>(mc.max_anchors, int64_t(most));
  RC_ASSERT(a.num_anchors() == N);
  for (int64_t b = 0; b < mc.mask.size(0); ++b) {
    const auto& c = cand[size_t(b)];
    const std::set<int64_t> valid(c.begin(), c.end());
    const int64_t kept = std::min<int64_t>(N, int64_t(c.size()));
    int64_t prev = -1;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t an = a.anchors[b][n].item<int64_t>();
      if (n < kept) {
        RC_ASSERT(a.keep[b][n].item<bool>());
        RC_ASSERT(valid.count(an) == 1u);  // a valid candidate
        RC_ASSERT(an > prev);              // sorted and unique
        prev = an;
      } else {
        RC_ASSERT(!a.keep[b][n].item<bool>());  // padding: anchor 0, keep false
        RC_ASSERT(an == 0);
      }
    }
  }
  Rng again(seed);
  const Anchors b = sample_anchors(mc.mask, mc.max_anchors, again);
  RC_ASSERT(at::equal(a.anchors, b.anchors) && at::equal(a.keep, b.keep));  // same seed
}

RC_GTEST_PROP(Anchors, DifferentSeedsDiffer, ()) {
  // A row with c candidates and N < c has C(c, N) >= c >= 12 possible draws:
  // eight seeds all drawing the same set has probability < 12^-7.
  const int64_t S = *rc::gen::inRange<int64_t>(13, 64);
  const int64_t max_anchors = *rc::gen::inRange<int64_t>(1, S - 2);
  const at::Tensor m = at::ones({1, S}, at::kBool);
  std::set<std::vector<int64_t>> draws;
  for (uint64_t s = 0; s < 8; ++s) {
    Rng rng(derive_seed(*rc::gen::arbitrary<uint64_t>(), "anchors", s));
    const Anchors a = sample_anchors(m, max_anchors, rng);
    std::vector<int64_t> v(a.anchors.data_ptr<int64_t>(),
                           a.anchors.data_ptr<int64_t>() + a.anchors.numel());
    draws.insert(v);
  }
  RC_ASSERT(draws.size() > 1u);
}

TEST(Anchors, DrawIsUniform) {
  // 10 candidates, N = 3: each is drawn with probability 3/10; over 4000
  // draws the count's standard deviation is ~29, so +-15% (180) is > 6 sigma.
  const at::Tensor m = at::ones({1, 11}, at::kBool);
  std::vector<int> hits(10, 0);
  Rng rng(99);
  for (int i = 0; i < 4000; ++i) {
    const Anchors a = sample_anchors(m, 3, rng);
    for (int64_t n = 0; n < 3; ++n) ++hits[size_t(a.anchors[0][n].item<int64_t>())];
  }
  for (int h : hits) EXPECT_NEAR(h, 1200, 180);
}

TEST(Anchors, NoCandidatesAnywhereGivesNoAnchors) {
  Rng rng(1);
  const Anchors a = sample_anchors(at::zeros({3, 9}, at::kBool), 4, rng);
  EXPECT_EQ(a.anchors.sizes(), (std::vector<int64_t>{3, 0}));
}

TEST(Anchors, ExtremesZeroAndSMinusTwo) {
  // Only positions {0, 1} and {S-2, S-1} are candidates' pairs.
  at::Tensor m = at::zeros({1, 8}, at::kBool);
  m[0][0] = m[0][1] = m[0][6] = m[0][7] = true;
  Rng rng(3);
  const Anchors a = sample_anchors(m, 5, rng);
  EXPECT_TRUE(at::equal(a.anchors, at::tensor({0, 6}, at::kLong).view({1, 2})));
  EXPECT_TRUE(a.keep.all().item<bool>());
}

// Hand-computed: S = 8, bs = 4, loss_mask 0 1 1 1 0 1 1 1 (hole at 4),
// anchors [1, 6, pad], gamma = 2.
struct LayoutCase {
  at::Tensor ids = at::arange(10, 18, at::kLong).view({1, 8});
  at::Tensor mask = at::tensor({0, 1, 1, 1, 0, 1, 1, 1}, at::kLong).to(at::kBool).view({1, 8});
  Anchors a{at::tensor({1, 6, 0}, at::kLong).view({1, 3}),
            at::tensor({1, 1, 0}, at::kLong).to(at::kBool).view({1, 3})};
};

std::vector<int64_t> vec(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous().view(-1);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(DraftLayout, HandComputedCase) {
  LayoutCase lc;
  const int64_t M = 99;
  const DraftLayout l = make_draft_layout(lc.ids, lc.mask, lc.a, 4, M, 2.0);
  EXPECT_EQ(vec(l.noise_ids), (std::vector<int64_t>{11, M, M, M, 16, M, M, M, M, M, M, M}));
  EXPECT_EQ(vec(l.positions), (std::vector<int64_t>{1, 2, 3, 4, 6, 7, 8, 9, 0, 1, 2, 3}));
  // Same position, no shift; past S the label is clamped (its weight is 0).
  EXPECT_EQ(vec(l.labels), (std::vector<int64_t>{11, 12, 13, 14, 16, 17, 17, 17, 10, 11, 12, 13}));
  EXPECT_EQ(vec(l.teacher_index), (std::vector<int64_t>{0, 1, 2, 3, 5, 6, 7, 7, 0, 0, 1, 2}));
  // k = 0 never counts; hole at 4; positions 8, 9 past S; the padding block.
  EXPECT_EQ(vec(l.counted), (std::vector<int64_t>{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}));
  const double e = std::exp(-0.5);  // k = 2 with gamma 2
  const std::vector<double> w = {0, 1, e, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  for (int64_t q = 0; q < 12; ++q)
    EXPECT_DOUBLE_EQ(l.weights[0][q].item<double>(), w[size_t(q)]) << q;
}

TEST(DraftLayout, NoDecayWhenGammaIsZero) {
  LayoutCase lc;
  const DraftLayout l = make_draft_layout(lc.ids, lc.mask, lc.a, 4, 99, 0.0);
  EXPECT_DOUBLE_EQ(l.weights[0][2].item<double>(), 1.0);
}

TEST(DraftLayout, DecayTable) {
  EXPECT_DOUBLE_EQ(slot_decay(0, 3.0), 1.0);
  EXPECT_DOUBLE_EQ(slot_decay(1, 3.0), 1.0);
  EXPECT_DOUBLE_EQ(slot_decay(2, 3.0), std::exp(-1.0 / 3.0));
  EXPECT_DOUBLE_EQ(slot_decay(5, 3.0), std::exp(-4.0 / 3.0));
  EXPECT_DOUBLE_EQ(slot_decay(5, 0.0), 1.0);
}

TEST(Rng, PortableSequence) {
  // std::mt19937_64's 10000th output is fixed by the C++ standard.
  std::mt19937_64 g(5489u);
  g.discard(9999);
  EXPECT_EQ(g(), 9981545732273789042ull);
  Rng a(derive_seed(1, "x")), b(derive_seed(1, "x")), c(derive_seed(1, "y"));
  EXPECT_EQ(a.next(), b.next());
  EXPECT_NE(a.next(), c.next());
}

}  // namespace
}  // namespace dflash
