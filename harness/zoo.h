// The bug zoo: every failure mode of SPEC.md's list as a mutant of a real
// component behind the same interface (optimized::Components, or a StepFn
// wrapping the real step), each with the harness check meant to kill it.
// Test-only in spirit: nothing here is reachable from the real step.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "harness/properties.h"
#include "optimized/step.h"

namespace dflash::harness {

// A memory ceiling check of one component implementation.
struct MemoryVerdict {
  bool ok;
  double measured, ceiling;
  std::string text;
};
// Both on CPU (the allocator probe), with the given kernels' ceiling.
MemoryVerdict attention_memory_check(const AttentionFn& attention,
                                     optimized::Kernels kernels = optimized::Kernels::kHost);
MemoryVerdict loss_memory_check(const LossFn& loss,
                                optimized::Kernels kernels = optimized::Kernels::kHost);

// The real two-shard split of a batch (what two drafter ranks compute):
// numerators and weight sums added over shards before dividing (SPEC step 9).
StepOutputs two_shard_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                           const StepInputs& in);

struct Mutant {
  std::string name;
  std::string failure_mode;  // the SPEC.md line it implements
  std::string meant_for;     // "parity", "audit" or "memory"
};
const std::vector<Mutant>& zoo();

struct KillRow {
  Mutant mutant;
  bool killed = false;
  std::string caught_by;  // the check that failed, or "" if the mutant survived
  std::string size;       // the shrunk counterexample, or the measured figure
  std::string detail;     // the check's message
  double seconds = 0;
};

// The loss of the chunk_logits_alive mutant (a chunked loss without
// recomputation), for the planner's calibration.
LossFn no_recompute_loss();

// Any mutant as a whole step (the preflight test hook), and as the
// optimized components it replaces (real ones elsewhere; the StepFn-only
// mutants per_rank_normalisation and frozen_embedding_trainable leave the
// components real).
StepFn mutant_step(const std::string& name);
optimized::Components mutant_components(const std::string& name);

// Runs one mutant under its check (parity: the step property with `run`),
// the step's loss and attention on `kernels` (every generated config's
// optimized.kernels is set to it; the mutants wrap the real components).
KillRow run_mutant(const Mutant& m, const PropertyRun& run,
                   optimized::Kernels kernels = optimized::Kernels::kHost);
std::vector<KillRow> run_zoo(const PropertyRun& run,
                             optimized::Kernels kernels = optimized::Kernels::kHost);
std::string kill_table(const std::vector<KillRow>& rows);

}  // namespace dflash::harness
