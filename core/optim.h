// AdamW over the drafter's fp32 master weights (SPEC.md step 11): linear
// warmup then cosine decay to min_lr_ratio * lr, gradient clipping by the
// global L2 norm, decoupled weight decay (0 by default).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

#include "core/weights.h"

namespace dflash {

struct OptimConfig {
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double clip_norm = 1.0;  // <= 0: no clipping
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine horizon; 0: constant after warmup
  double min_lr_ratio = 0.0;
};

// The [train] section's optimizer settings; the cosine horizon is train.steps.
OptimConfig optim_config(const TrainConfig& t);

class AdamW {
 public:
  AdamW(const NamedTensors& params, const OptimConfig& cfg);

  double lr_at(int64_t step) const;  // step counts from 0
  struct Stats {
    double grad_norm;  // before clipping
    double lr;
  };
  // One update from the parameters' .grad(); a parameter without a gradient
  // is skipped (its moments do not move either).
  Stats step();
  int64_t steps_taken() const { return t_; }
  // Moments by parameter name ("exp_avg.<name>", "exp_avg_sq.<name>").
  NamedTensors state() const;
  // Restores state() and the step count (resume); every moment must be
  // present with its parameter's shape, else an error naming `label`.
  void load_state(const std::map<std::string, at::Tensor>& moments, int64_t steps_taken,
                  const std::string& label);

 private:
  NamedTensors params_;
  std::vector<at::Tensor> m_, v_;
  OptimConfig cfg_;
  int64_t t_ = 0;
};

// Gradient accumulation, shared by the single-process loop and the split:
// clear the drafter's gradients; divide the summed numerator's gradients by
// the global weight sum (den > 0; SPEC.md step 9).
void zero_grads(const DrafterWeights& w);
void scale_grads(const DrafterWeights& w, double den);
// The drafter's parameters as safetensors (`path` "": nothing written).
void write_params(const std::string& path, const DrafterWeights& w);

}  // namespace dflash
