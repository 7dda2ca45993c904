// The signature both builds share: reference::drafter_step and
// optimized::drafter_step take and return these types, so the harness can
// swap one for the other.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "core/batch.h"
#include "core/config.h"
#include "core/weights.h"

namespace dflash {

struct StepInputs {
  at::Tensor input_ids;      // (B, S) int64
  at::Tensor loss_mask;      // (B, S) bool
  at::Tensor features;       // (B, S, L*H) tapped target layers, no grad
  at::Tensor target_hidden;  // (B, S, H) target's final normed hidden, no grad
  Anchors anchors;           // anchors, keep: (B, N)
};

// Sums are kept beside the ratios so that data parallelism can add numerators
// and denominators over micro-batches and ranks before dividing (SPEC step 9).
struct StepOutputs {
  at::Tensor loss;            // () differentiable: sum over objectives of weight * term
  at::Tensor ce;              // () detached, sum(w*CE) / sum(w)
  at::Tensor kl;              // () detached, sum(w*KL) / sum(w); 0 when kl_weight == 0
  at::Tensor ce_sum;          // () detached, sum(w*CE)
  at::Tensor kl_sum;          // () detached, sum(w*KL)
  // The other objectives (docs/LOSSES.md), as kl: 0 when their weight is 0.
  at::Tensor reverse_kl, reverse_kl_sum;  // () detached, KL(p_s || p_t)
  at::Tensor jsd, jsd_sum;                // () detached, JSD_beta
  at::Tensor tv, tv_sum;                  // () detached, total variation
  at::Tensor weight_sum;      // () detached, sum(w) (D-PACE: of the detached dynamic weights)
  at::Tensor correct;         // (bs) int64, counted slots with argmax == label
  at::Tensor counted;         // (bs) int64, slots with w > 0 before decay
  at::Tensor accept_sum;      // () int64, sum over kept blocks of accepted length
  at::Tensor kept_blocks;     // () int64
  at::Tensor student_hidden;  // (B, Q, H) D, detached

  void set_metrics(const SlotMetrics& m);
  at::Tensor accuracy() const;  // (bs) float64, correct / counted (0 where none)
  double tau() const;           // 1 + accept_sum / kept_blocks (1 when none kept)
};

using StepFn = std::function<StepOutputs(const Config&, const DrafterWeights&, const FrozenWeights&,
                                         const StepInputs&)>;

// The floating dtype a config runs in.
at::ScalarType scalar_type(DType d);

// Sets libtorch's intra-op threads: `requested` if > 0, else OMP_NUM_THREADS
// if set, else the core count. Returns the number in effect.
int configure_threads(int64_t requested);

}  // namespace dflash

namespace dflash {

// One forward + backward of a StepFn: clears the drafter's gradients, runs the
// step, back-propagates the loss, and collects every trainable gradient.
struct StepResult {
  StepOutputs out;
  NamedTensors grads;  // grad.<name> in drafter_specs order; undefined if none
  double grad_norm;    // global L2 norm over the defined gradients
};
StepResult run_step(const StepFn& fn, const Config& c, const DrafterWeights& w,
                    const FrozenWeights& f, const StepInputs& in);

}  // namespace dflash
