// The row kernels' edge cases: the vectorised exp's and log1p's accuracy, a NaN row (the
// argmax scan must stay in bounds), and attention rows that see nothing in a
// tile (statistics unchanged, no write before the row).
#include "optimized/row_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

TEST(RowKernels, NanRowStaysInBounds) {
  const int64_t V = 8;
  std::vector<float> zs(V, 1.0f);
  zs[0] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int64_t> labels{3}, argmax{-1};
  std::vector<double> w{1.0}, ce{0}, kl{0}, rkl{0}, jsd{0}, tv{0};
  LossRows a{RowDtype::kFloat32,
             V,
             zs.data(),
             nullptr,
             labels.data(),
             w.data(),
             {1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0},
             true,
             ce.data(),
             kl.data(),
             rkl.data(),
             jsd.data(),
             tv.data(),
             argmax.data()};
  loss_rows(a, 0, 1);
  EXPECT_GE(argmax[0], 0);
  EXPECT_LT(argmax[0], V);
  EXPECT_TRUE(std::isnan(ce[0]));  // reported, for the caller's finiteness checks
}

// Every objective's gradient is a softmax-Jacobian product, so each row of
// it sums to 0: the general path reports that sum, and it is 0 to rounding.
TEST(RowKernels, GeneralPathGradientRowsSumToZero) {
  const int64_t V = 4099, R = 3;  // odd V: vector body and scalar tail both run
  std::vector<float> zs(size_t(R * V)), zt(size_t(R * V));
  for (int64_t i = 0; i < R * V; ++i) {
    zs[size_t(i)] = float(std::sin(0.37 * double(i)) * 4.0);
    zt[size_t(i)] = float(std::cos(0.11 * double(i)) * 4.0);
  }
  std::vector<int64_t> labels{3, 100, 4000}, argmax(R, -1);
  std::vector<double> w(R, 1.0), ce(R), kl(R), rkl(R), jsd(R), tv(R), sums(R, 99.0);
  LossRows a{RowDtype::kFloat32,
             V,
             zs.data(),
             zt.data(),
             labels.data(),
             w.data(),
             {0.5, 0.3, 0.4, 0.6, 0.3, 0.7, 1.0 / 1.3},
             true,
             ce.data(),
             kl.data(),
             rkl.data(),
             jsd.data(),
             tv.data(),
             argmax.data(),
             sums.data()};
  loss_rows(a, 0, R);
  for (int64_t r = 0; r < R; ++r) {
    double abs_sum = 0;  // the row's gradient scale
    for (int64_t v = 0; v < V; ++v) abs_sum += std::abs(double(zs[size_t(r * V + v)]));
    ASSERT_GT(abs_sum, 0.0);
    EXPECT_LT(std::abs(sums[size_t(r)]), 1e-5 * abs_sum) << "row " << r;
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
