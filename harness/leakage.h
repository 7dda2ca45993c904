// The information-flow (leakage) audit: SPEC.md's failure mode "the context
// visible up to and including the anchor" and its kin, found by autograd
// instead of by reading the mask. For every kept block (b, n) of a step,
// in float64, the gradient of that block's loss
//   L_bn = sum_k w[b, q] * CE(D[b, q] W_lm^T, label[b, q]),  q = n*bs + k
// must be exactly zero with respect to
//   - the target features F[b', j] of any other row b', and of its own row
//     at every position j >= anchor_n (the block may only see the context
//     strictly before its anchor), and
//   - the noise embedding of every slot outside the block (any other
//     block, of any row).
// A failure names the first (row, block, anchor) and the input it reads.
// The noise embeddings are made leaves by giving each slot its own row of a
// probe embedding table (the slot's own embedding), so the builds' own
// drafter_hidden runs unchanged.
#pragma once

#include <functional>
#include <string>

#include "core/batch.h"
#include "core/step.h"
#include "optimized/step.h"

namespace dflash::harness {

// A build's drafter forward: D (B, Q, H) with graph (reference::drafter_hidden,
// optimized::drafter_hidden).
using HiddenFn =
    std::function<at::Tensor(const Config&, const DrafterWeights&, const FrozenWeights&,
                             const StepInputs&, const DraftLayout&)>;

// The two builds' forwards (the optimized one with chosen components).
HiddenFn reference_hidden();
HiddenFn optimized_hidden(const optimized::Components& parts = optimized::real_components());

struct LeakageReport {
  int64_t blocks = 0;        // kept blocks whose loss carries weight, checked
  int64_t sees_context = 0;  // of them, blocks whose loss depends on earlier context
  std::string finding;       // "" when nothing leaks: the first leak
  bool ok() const { return finding.empty(); }
  std::string format() const;
};

LeakageReport audit_leakage(const HiddenFn& hidden, const Config& c, const DrafterWeights& w,
                            const FrozenWeights& f, const StepInputs& in);

// The audit over `steps` fixture steps of config c (its seeded target and
// drafter): the first leak, or the blocks checked.
LeakageReport audit_leakage_fixture(const HiddenFn& hidden, const Config& c, int64_t steps = 2);

}  // namespace dflash::harness
