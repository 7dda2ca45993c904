// Shared by the split's tests (dist/split_test.cpp, dist/netns_nightly_test.cpp):
// the losses a run printed, and a split run's parameters against one process's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "fixtures/test_support.h"
#include "harness/tolerance.h"

namespace dflash::testing_support {

// Every progress line's loss ("step   N  loss L ..."), in order.
inline std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  const std::regex re("step +\\d+  loss ([0-9.eE+-]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    l.push_back(std::stod((*it)[1]));
  return l;
}

// Parameters of the split run against the single-process run: float64, tight.
inline harness::ComparisonReport compare_params(const std::string& split,
                                                const std::string& single) {
  const auto a = safetensors::read(split), b = safetensors::read(single);
  harness::ComparisonReport rep;
  for (const auto& [name, t] : b.tensors)
    rep.rows.push_back(harness::compare(name, a.get(name), t, t, {1.0, 1e-12}));
  return rep;
}

// A split run and one process's over the same micro-batches: the parameters
// written by --out-params float64-tight, and the same loss at every step.
inline void expect_same_run(const Shell& split, const Shell& single,
                            const std::string& split_params, const std::string& single_params,
                            size_t steps) {
  ASSERT_EQ(split.code, 0) << split.out;
  ASSERT_EQ(single.code, 0) << single.out;
  const auto rep = compare_params(split_params, single_params);
  EXPECT_TRUE(rep.ok()) << rep.format();
  const auto ls = losses(split.out), l1 = losses(single.out);
  ASSERT_EQ(ls.size(), steps) << split.out;
  ASSERT_EQ(l1.size(), steps) << single.out;
  for (size_t i = 0; i < ls.size(); ++i) EXPECT_NEAR(ls[i], l1[i], 1e-10 * (1 + std::abs(l1[i])));
}

}  // namespace dflash::testing_support
