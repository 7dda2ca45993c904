// Reference vs optimized, same inputs, same process: the benchmark cases
// behind `dflash bench` and the Google Benchmark binaries. Each case builds
// its inputs once and can run either build's forward + backward, measuring
// wall time and the peak live bytes of the c10 CPU allocator (AllocProbe).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dflash::harness {

struct PathResult {
  double seconds = 0;      // best of the repeats (wall clock)
  double sys_seconds = 0;  // kernel time of that run (page faults of fresh allocations)
  int64_t peak_bytes = 0;  // absolute peak (inputs included), worst of the repeats
};

class BenchCase {
 public:
  virtual ~BenchCase() = default;
  virtual std::string name() const = 0;
  virtual std::string shape() const = 0;           // the sizes, for the table
  virtual double flops(bool optimized) const = 0;  // analytic, forward + backward
  // A lower bound on the optimized build's peak (0 when none is stated).
  virtual int64_t floor_bytes() const { return 0; }
  virtual std::string floor_formula() const { return ""; }
  virtual void run(bool optimized) = 0;  // one forward + backward
};

// The issue-3 target sizes, or CI-sized ones with quick = true.
std::unique_ptr<BenchCase> loss_case(bool quick);
std::unique_ptr<BenchCase> attention_case(bool quick);
std::unique_ptr<BenchCase> step_case(bool quick);

PathResult measure(BenchCase& c, bool optimized, int repeats);

// fp32 GEMM rate of this machine now (GFLOP/s), on the loss's GEMM shape.
double gemm_gflops(bool quick);

struct BenchOptions {
  std::vector<std::string> cases;  // empty: all
  bool quick = false;
  int repeats = 2;
  std::string json_path;  // write the results here too
};
int run_bench(const BenchOptions& o);

}  // namespace dflash::harness
