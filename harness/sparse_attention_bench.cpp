// Google Benchmark: block-sparse vs dense masked attention, forward + backward.
#include "harness/bench_main.h"

DFLASH_BENCH_PAIR(Attention, dflash::harness::attention_case({/*quick=*/true}))
BENCHMARK_MAIN();
