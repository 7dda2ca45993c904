// `dflash bench --dist`: hidden-state transfer throughput (target -> drafter),
// all-reduce bus bandwidth over the drafter ranks (nccl-tests' busbw =
// algbw * 2 (n - 1) / n), and the fraction of drafter step time spent
// waiting for target data in a short training run.
#include <fmt/format.h>

#include <chrono>

#include "dist/cluster.h"
#include "dist/split_loop.h"

namespace dflash::dist {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int run_dist_bench(const Config& c) {
  configure_threads(c.run.threads);
  dist::Cluster cl(c, dist::env_from_process());
  const int64_t reps = 8, mb = 32;
  at::Tensor payload = at::ones({mb << 18}, at::kFloat);  // 32 MB
  // Transfer: the first target rank to the first drafter rank.
  const int64_t src = cl.target_rank(0), dst = cl.drafter_rank(0);
  cl.barrier_world("bench start");
  double transfer_gbps = 0;
  if (cl.rank() == src || cl.rank() == dst) {
    std::vector<at::Tensor> t{payload};
    const double t0 = now();
    for (int64_t i = 0; i < reps; ++i) {
      if (cl.rank() == src)
        cl.send(t, dst, int(1000 + i), "bench transfer");
      else
        cl.recv(t, src, int(1000 + i), "bench transfer");
    }
    transfer_gbps = double(reps * payload.nbytes()) / (now() - t0) / 1e9;
  }
  // All-reduce among the drafters.
  double algbw = 0, busbw = 0;
  if (cl.is_drafter()) {
    std::vector<at::Tensor> t{payload.clone()};
    cl.allreduce_drafters(t, "bench all-reduce");  // warm-up
    const double t0 = now();
    for (int64_t i = 0; i < reps; ++i) cl.allreduce_drafters(t, "bench all-reduce");
    const double per = (now() - t0) / double(reps), n = double(cl.num_drafters());
    algbw = double(payload.nbytes()) / per / 1e9;
    busbw = algbw * 2 * (n - 1) / n;
  }
  cl.barrier_world("bench transfers done");
  // Waiting for target data during real steps.
  TrainOptions o;
  o.steps = 6;
  const std::vector<StepLog> log = train_distributed(c, o, cl);
  if (cl.is_drafter() && cl.drafter_index() == 0) {
    double wait = 0, total = 0;
    for (size_t i = 1; i < log.size(); ++i)
      wait += log[i].wait_seconds, total += log[i].step_seconds;
    fmt::print("\ndflash bench --dist ({} ranks: {} target, {} drafter, loopback gloo)\n",
               cl.world_size(), cl.num_targets(), cl.num_drafters());
    fmt::print(
        "  all-reduce of {} MB over {} drafter ranks: algbw {:.2f} GB/s, busbw {:.2f} GB/s\n", mb,
        cl.num_drafters(), algbw, busbw);
    fmt::print(
        "  drafter step time waiting for target data: {:.1f}% ({:.3f} s of {:.3f} s, steps 1-{})\n",
        total > 0 ? 100 * wait / total : 0.0, wait, total, log.size() - 1);
  }
  if (cl.rank() == dst)
    fmt::print("  transfer target rank {} -> drafter rank {}: {:.2f} GB/s ({} x {} MB)\n", src, dst,
               transfer_gbps, reps, mb);
  return 0;
}

}  // namespace dflash::dist
