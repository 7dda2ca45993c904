#include <ATen/Parallel.h>

#include <cstdlib>
#include <thread>

#include "core/step.h"

namespace dflash {

void StepOutputs::set_metrics(const SlotMetrics& m) {
  correct = m.correct;
  counted = m.counted;
  accept_sum = m.accept_sum;
  kept_blocks = m.kept_blocks;
}

at::Tensor StepOutputs::accuracy() const {
  return correct.to(at::kDouble) / counted.clamp_min(1).to(at::kDouble);
}

double StepOutputs::tau() const {
  const int64_t kept = kept_blocks.item<int64_t>();
  if (kept == 0) return 1.0;
  return 1.0 + double(accept_sum.item<int64_t>()) / double(kept);
}

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kBFloat16:
      return at::kBFloat16;
  }
  return at::kFloat;
}

int configure_threads(int64_t requested) {
  int n = int(requested);
  if (n <= 0) {
    const char* env = std::getenv("OMP_NUM_THREADS");
    if (env && std::atoi(env) > 0) n = std::atoi(env);
  }
  if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n);
  return at::get_num_threads();
}

}  // namespace dflash

namespace dflash {

StepResult run_step(const StepFn& fn, const Config& c, const DrafterWeights& w,
                    const FrozenWeights& f, const StepInputs& in) {
  NamedTensors params = named(w);
  for (auto& [name, t] : params) {
    TORCH_CHECK(t.requires_grad(), "run_step: drafter parameter ", name, " does not require grad");
    t.mutable_grad().reset();
  }
  StepResult r;
  r.out = fn(c, w, f, in);
  r.out.loss.backward();
  double sq = 0;
  for (auto& [name, t] : params) {
    at::Tensor g = t.grad();
    if (g.defined()) sq += g.to(at::kDouble).pow(2).sum().item<double>();
    r.grads.emplace_back(name, g);
  }
  r.grad_norm = std::sqrt(sq);
  return r;
}

}  // namespace dflash
