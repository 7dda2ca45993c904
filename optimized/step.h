// The optimized DFlash step: the reference's math with the memory tricks,
// each switchable in [optimized] so one can be turned off while debugging:
//   chunked_loss       fused chunked LM-head loss (optimized/chunked_loss)
//   sparse_attention   tiled block-sparse attention (optimized/sparse_attention)
//   checkpoint_layers  per-layer activation checkpointing (optimized/checkpoint)
// Layer math that is not a trick (norms, RoPE, projections, MLP) is the
// reference's own code, so the two builds cannot drift apart there.
#pragma once

#include "core/step.h"

namespace dflash::optimized {

at::Tensor drafter_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                          const StepInputs& in, const DraftLayout& layout);

// Twin of reference::drafter_step; matches dflash::StepFn. For a bfloat16
// run the trainable weights are fp32 masters, cast to bf16 for compute; the
// loss accumulates in fp32.
StepOutputs drafter_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                         const StepInputs& in);

}  // namespace dflash::optimized
