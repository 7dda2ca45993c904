// Google Benchmark: the optimized drafter step vs the reference step.
#include "harness/bench_main.h"

DFLASH_BENCH_PAIR(Step, dflash::harness::step_case({/*quick=*/true}))
BENCHMARK_MAIN();
