// Shared by the split's tests (dist/split_test.cpp, dist/netns_nightly_test.cpp):
// the losses a run printed, and a split run's parameters against one process's.
#pragma once

#include <regex>
#include <string>
#include <vector>

#include "core/safetensors.h"
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

}  // namespace dflash::testing_support
