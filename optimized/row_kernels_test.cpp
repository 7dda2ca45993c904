// The row kernels' edge cases: the vectorised exp's and log1p's accuracy, a NaN row (the
// argmax scan must stay in bounds), and attention rows that see nothing in a
// tile (statistics unchanged, no write before the row).
#include "optimized/row_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace dflash::optimized {
namespace {

TEST(RowKernels, FastExpIsAccurate) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double e = std::exp(double(x));
    worst = std::max(worst, std::abs(double(fast_expf(x)) - e) / e);
  }
  EXPECT_LT(worst, 1e-7);
  EXPECT_GT(fast_expf(-200.0f), 0.0f);  // clamped, never 0 or NaN
}

// The JSD mixture's log-sum-exp correction: log(1 + x) on [0, 1], tiny x
// included (where log(1 + x) computed as written would round to 0).
TEST(RowKernels, FastLog1pIsAccurate) {
  double worst = 0;
  for (double x = 1.0; x > 1e-30; x *= 0.937) {
    const double e = std::log1p(double(float(x)));
    worst = std::max(worst, std::abs(double(fast_log1pf(float(x))) - e) / e);
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(fast_log1pf(0.0f), 0.0f);
}

// R rows of V float32 logits (smooth, different student and teacher) and
// the per-row outputs of loss_rows.
struct FloatRows {
  int64_t V, R;
  std::vector<float> zs, zt;
  std::vector<int64_t> labels, argmax;
  std::vector<double> w, ce, kl, rkl, jsd, tv, sums;
  FloatRows(int64_t V_, std::vector<int64_t> labels_)
      : V(V_),
        R(int64_t(labels_.size())),
        zs(size_t(R * V)),
        zt(size_t(R * V)),
        labels(std::move(labels_)),
        argmax(size_t(R), -1),
        w(size_t(R), 1.0),
        ce(size_t(R)),
        kl(size_t(R)),
        rkl(size_t(R)),
        jsd(size_t(R)),
        tv(size_t(R)),
        sums(size_t(R), 99.0) {
    for (int64_t i = 0; i < R * V; ++i) {
      zs[size_t(i)] = float(std::sin(0.37 * double(i)) * 4.0);
      zt[size_t(i)] = float(std::cos(0.11 * double(i)) * 4.0);
    }
  }
  void run(const RowObjectives& o, bool scratch, bool with_teacher = true) {
    LossRows a{RowDtype::kFloat32,
               V,
               zs.data(),
               with_teacher ? zt.data() : nullptr,
               labels.data(),
               w.data(),
               o,
               true,
               ce.data(),
               kl.data(),
               rkl.data(),
               jsd.data(),
               tv.data(),
               argmax.data(),
               sums.data(),
               scratch};
    loss_rows(a, 0, R);
  }
};

TEST(RowKernels, NanRowStaysInBounds) {
  FloatRows f(8, {3});
  std::fill(f.zs.begin(), f.zs.end(), 1.0f);
  f.zs[0] = std::numeric_limits<float>::quiet_NaN();
  f.run({1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0}, false, /*with_teacher=*/false);
  const int64_t V = f.V;
  const std::vector<int64_t>& argmax = f.argmax;
  const std::vector<double>& ce = f.ce;
  EXPECT_GE(argmax[0], 0);
  EXPECT_LT(argmax[0], V);
  EXPECT_TRUE(std::isnan(ce[0]));  // reported, for the caller's finiteness checks
}

// Every objective's gradient is a softmax-Jacobian product, so each row of
// it sums to 0: the general path reports that sum, and it is 0 to rounding.
TEST(RowKernels, GeneralPathGradientRowsSumToZero) {
  FloatRows f(4099, {3, 100, 4000});  // odd V: vector body and scalar tail both run
  f.run({0.5, 0.3, 0.4, 0.6, 0.3, 0.7, 1.0 / 1.3}, false);
  for (int64_t r = 0; r < f.R; ++r) {
    double abs_sum = 0;  // the row's gradient scale
    for (int64_t v = 0; v < f.V; ++v) abs_sum += std::abs(double(f.zs[size_t(r * f.V + v)]));
    ASSERT_GT(abs_sum, 0.0);
    EXPECT_LT(std::abs(f.sums[size_t(r)]), 1e-5 * abs_sum) << "row " << r;
  }
}

// With scratch teacher rows (the fused loss) the general path caches its
// first pass's per-element values instead of recomputing them; the values
// and the gradient must be those of the recomputing path, to rounding, for
// every cache layout (no TV; TV alone; TV with others) at T = 1 and T != 1.
TEST(RowKernels, ScratchCacheMatchesRecompute) {
  // {ce, kl, reverse_kl, jsd, jsd_beta, tv, 1/T}
  const std::vector<RowObjectives> cases = {
      {1.0, 0.0, 1.0, 0.0, 0.5, 0.0, 1.0},       {1.0, 0.0, 0.0, 1.0, 0.3, 0.0, 1.0},
      {0.5, 0.3, 0.4, 0.6, 0.3, 0.0, 1.0 / 1.3}, {1.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.0},
      {0.5, 0.7, 0.0, 0.0, 0.5, 0.4, 1.0 / 1.3}, {0.5, 0.3, 0.4, 0.6, 0.3, 0.7, 1.0}};
  for (size_t c = 0; c < cases.size(); ++c) {
    FloatRows plain(1031, {3, 100, 1000}), cached = plain;
    plain.run(cases[c], false);
    cached.run(cases[c], true);
    double scale = 0, worst = 0;
    for (size_t i = 0; i < plain.zs.size(); ++i) {
      scale = std::max(scale, std::abs(double(plain.zs[i])));
      worst = std::max(worst, std::abs(double(plain.zs[i]) - double(cached.zs[i])));
    }
    ASSERT_GT(scale, 0.0);
    EXPECT_LT(worst, 1e-5 * scale) << "case " << c << ": gradient";
    for (int64_t r = 0; r < plain.R; ++r) {
      const size_t i = size_t(r);
      for (auto [x, y] : {std::pair{plain.kl[i], cached.kl[i]},
                          {plain.rkl[i], cached.rkl[i]},
                          {plain.jsd[i], cached.jsd[i]},
                          {plain.tv[i], cached.tv[i]}})
        EXPECT_NEAR(x, y, 1e-6 * (1 + std::abs(x))) << "case " << c << " row " << r;
      EXPECT_NEAR(plain.sums[i], cached.sums[i], 1e-5 * scale) << "case " << c;
    }
  }
}

TEST(RowKernels, TileWithNothingVisibleLeavesStatisticsAlone) {
  // Two rows, three columns; row 0 sees keys < 2, row 1 (limit below the
  // tile's offset) sees none.
  std::vector<float> s = {0.5f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  std::vector<int64_t> limit = {12, 7};
  std::vector<float> m = {-std::numeric_limits<float>::infinity(), 1.5f}, l = {0.0f, 2.0f};
  std::vector<float> acc = {0.0f, 0.0f, 7.0f, 8.0f};  // hd = 2
  AttentionRows a{RowDtype::kFloat32, 2, 3, s.data(), limit.data(), 10, 1.0};
  online_softmax_rows(a, m.data(), l.data(), acc.data(), 2);
  EXPECT_FLOAT_EQ(m[0], 1.0f);
  EXPECT_FLOAT_EQ(s[2], 0.0f);  // masked column of row 0
  EXPECT_FLOAT_EQ(m[1], 1.5f);  // row 1 untouched
  EXPECT_FLOAT_EQ(l[1], 2.0f);
  EXPECT_FLOAT_EQ(acc[2], 7.0f);
  EXPECT_FLOAT_EQ(s[3] + s[4] + s[5], 0.0f);
}

}  // namespace
}  // namespace dflash::optimized
