// Reference vs optimized, same inputs, same process: the benchmark cases
// behind `dflash bench` and the Google Benchmark binaries. Each case builds
// its inputs once and can run either build's forward + backward, measuring
// wall time and the peak live bytes of the device's allocator (AllocProbe:
// the c10 CPU allocator, or the CUDA caching allocator's statistics).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"

namespace dflash::harness {

struct PathResult {
  double seconds = 0;       // best of the repeats (wall clock)
  double sys_seconds = 0;   // kernel time of that run (page faults of fresh allocations)
  int64_t peak_bytes = 0;   // absolute peak (inputs included), worst of the repeats
  int64_t start_bytes = 0;  // live at the start of that worst run (its peak_delta's base)
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

// Where and at what size a case runs: the issue-3 sizes on CPU (fp32), the
// GPU sizes of docs/GPU.md on CUDA (bf16: loss Q=8192 H=4096 V=128256,
// attention S=8192 with 256 blocks of 16), or CI-sized ones with quick.
struct BenchWhere {
  bool quick = false;
  c10::Device device{c10::kCPU};
  std::string kernels = "auto";  // [optimized] kernels of the optimized path
  bool gpu_sizes() const { return !quick && !device.is_cpu(); }
};
std::unique_ptr<BenchCase> loss_case(const BenchWhere& w);
// The objectives table of `dflash bench` (--case objectives): the loss case
// with each objective of docs/LOSSES.md, CE + KL first (the baseline).
struct LossObjective {
  const char* name;
  LossConfig loss;  // chunk_size is the case's
};
std::vector<LossObjective> loss_objectives();
std::unique_ptr<BenchCase> loss_case(const BenchWhere& w, const LossObjective& objective);
std::unique_ptr<BenchCase> attention_case(const BenchWhere& w);
std::unique_ptr<BenchCase> step_case(const BenchWhere& w);

PathResult measure(BenchCase& c, bool optimized, int repeats,
                   const c10::Device& device = c10::Device(c10::kCPU));

// GEMM rate of this device now (GFLOP/s) on the loss's GEMM shape: fp32 on
// CPU, bf16 on CUDA.
double gemm_gflops(bool quick, const c10::Device& device = c10::Device(c10::kCPU));

struct BenchOptions {
  std::vector<std::string> cases;  // empty: all
  bool quick = false;
  int repeats = 2;
  std::string json_path;  // write the results here too
  std::string device = "cpu";
  std::string kernels = "auto";  // auto | host | aten: the optimized path's row work
};
int run_bench(const BenchOptions& o);

}  // namespace dflash::harness
