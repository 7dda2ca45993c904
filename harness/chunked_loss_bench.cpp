// Google Benchmark: the fused chunked loss vs the full-logits reference
// (CI-sized inputs; `dflash bench --case loss` runs the issue-3 sizes).
#include "harness/bench_main.h"

DFLASH_BENCH_PAIR(Loss, dflash::harness::loss_case({/*quick=*/true}))
BENCHMARK_MAIN();
