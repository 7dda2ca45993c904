// The reference DFlash drafter step (SPEC.md "One step"): dense masked
// attention, full logits, plain autograd. It is the spec in code.
#pragma once

#include <ATen/ATen.h>

#include "core/batch.h"
#include "core/step.h"

namespace dflash::reference {

// SPEC step 7 as an explicit boolean tensor: (B, Q, S+Q), true where draft
// slot q = n*bs + k may attend key j.
at::Tensor build_draft_mask(const Anchors& a, int64_t seq_len, int64_t block_size);

// Student hidden D = norm(x) after the drafter layers: (B, Q, H), with graph.
at::Tensor drafter_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                          const StepInputs& in, const DraftLayout& layout);

// Loss and metrics from D with full (B, Q, V) logits (SPEC steps 8-10).
StepOutputs loss_and_metrics(const Config& c, const at::Tensor& student_hidden,
                             const at::Tensor& target_hidden, const at::Tensor& lm_head,
                             const DraftLayout& layout, const Anchors& a);

// The whole forward: layout, drafter, loss. Matches dflash::StepFn.
StepOutputs drafter_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                         const StepInputs& in);

}  // namespace dflash::reference
