// Shared body of the Google Benchmark binaries beside each component: the
// reference and the optimized path of one harness::BenchCase, with the peak
// bytes of the c10 allocator and the analytic FLOP rate as counters.
#pragma once

#include <benchmark/benchmark.h>

#include <memory>

#include "core/alloc_probe.h"
#include "core/step.h"
#include "harness/bench.h"

namespace dflash::harness {

inline void run_path(benchmark::State& state, BenchCase& c, bool optimized) {
  configure_threads(0);
  AllocProbe::install();
  int64_t peak = 0;
  for (auto _ : state) {
    AllocProbe::Scope scope;
    c.run(optimized);
    peak = std::max(peak, scope.peak_bytes());
  }
  state.counters["peak_MiB"] = double(peak) / (1024.0 * 1024.0);
  state.counters["FLOPS"] =
      benchmark::Counter(c.flops(optimized), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace dflash::harness

#define DFLASH_BENCH_PAIR(Name, make_case)                                       \
  static void BM_##Name##Reference(benchmark::State& s) {                        \
    auto c = make_case;                                                          \
    dflash::harness::run_path(s, *c, false);                                     \
  }                                                                              \
  static void BM_##Name##Optimized(benchmark::State& s) {                        \
    auto c = make_case;                                                          \
    dflash::harness::run_path(s, *c, true);                                      \
  }                                                                              \
  BENCHMARK(BM_##Name##Reference)->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK(BM_##Name##Optimized)->Unit(benchmark::kMillisecond)->UseRealTime();
