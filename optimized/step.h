// The optimized DFlash step: the reference's math with the memory tricks,
// each switchable in [optimized] so one can be turned off while debugging:
//   chunked_loss       fused chunked LM-head loss (optimized/chunked_loss)
//   sparse_attention   tiled block-sparse attention (optimized/sparse_attention)
//   checkpoint_layers  per-layer activation checkpointing (optimized/checkpoint)
// Layer math that is not a trick (norms, RoPE, projections, MLP) is the
// reference's own code, so the two builds cannot drift apart there.
#pragma once

#include <functional>

#include "core/step.h"
#include "optimized/checkpoint.h"
#include "optimized/kernels.h"

namespace dflash::optimized {

// The replaceable parts of the step, each with its real implementation as
// the default. The harness's bug zoo swaps in mutants behind these same
// interfaces; production code never changes them.
struct Components {
  std::function<DraftLayout(const Config&, const StepInputs&)> layout;
  // Sparse attention: q (B, nh, Q, hd), k/v (B, nkv, S+Q, hd) -> (B, nh, Q, hd).
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Anchors& a, int64_t seq_len, int64_t block_size, int64_t tile,
                           Kernels kernels)>
      attention;
  std::function<StepOutputs(const Config&, const at::Tensor& student_hidden,
                            const at::Tensor& target_hidden, const at::Tensor& lm_head,
                            const DraftLayout& layout, const Anchors& a)>
      loss;
  std::function<at::Tensor(const CheckpointContract&, const CheckpointFn&)> checkpoint;
};
const Components& real_components();

at::Tensor drafter_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                          const StepInputs& in, const DraftLayout& layout,
                          const Components& parts = real_components());

// The step with chosen components (the zoo's entry point).
StepOutputs drafter_step_with(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                              const StepInputs& in, const Components& parts);

// Twin of reference::drafter_step; matches dflash::StepFn. For a bfloat16
// run the trainable weights are fp32 masters, cast to bf16 for compute; the
// loss accumulates in fp32.
StepOutputs drafter_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                         const StepInputs& in);

}  // namespace dflash::optimized
