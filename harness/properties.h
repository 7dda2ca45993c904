// The parity properties, runnable from code with a chosen case count and seed
// (RapidCheck's checkProperty), so that ctest, `dflash parity` and the bug
// zoo all run the very same checks. A failure is shrunk by RapidCheck; the
// outcome carries the minimal counterexample (a ready-to-run TOML for step
// properties) and the comparison table of that minimal case.
#pragma once

#include <functional>
#include <string>

#include "core/step.h"
#include "optimized/checkpoint.h"

namespace dflash::harness {

struct PropertyRun {
  int cases = 100;
  uint64_t seed = 1;
};

struct PropertyOutcome {
  std::string name;
  bool passed = false;
  int cases_passed = 0;        // before the first failure, or all of them
  std::string report;          // comparison table of the minimal failing case
  std::string counterexample;  // minimal failing case (TOML for step properties)
  std::string size;            // its dimensions, one line
  uint64_t seed = 0;
  double seconds = 0;
};

// Signatures of the swappable components (the optimized twins).
using LossFn = std::function<StepOutputs(const Config&, const at::Tensor& student_hidden,
                                         const at::Tensor& target_hidden, const at::Tensor& lm_head,
                                         const DraftLayout&, const Anchors&)>;
using AttentionFn =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const Anchors& a, int64_t seq_len, int64_t block_size, int64_t tile)>;
using CheckpointImpl =
    std::function<at::Tensor(const optimized::CheckpointContract&, const optimized::CheckpointFn&)>;

// Whole step: generated configs (gen_step_config) through step_parity.
PropertyOutcome check_step_parity(const StepFn& candidate, const PropertyRun& run,
                                  const std::string& name = "parity.step");
// Components against their reference twins, float64 and float32, random
// (non-uniform) upstream gradients.
PropertyOutcome check_loss_parity(const LossFn& candidate, const PropertyRun& run,
                                  const std::string& name = "parity.loss");
PropertyOutcome check_attention_parity(const AttentionFn& candidate, const PropertyRun& run,
                                       const std::string& name = "parity.attention");
PropertyOutcome check_checkpoint_parity(const CheckpointImpl& candidate, const PropertyRun& run,
                                        const std::string& name = "parity.checkpoint");

// Runs `body` as a RapidCheck property; `body` returns "" on success or the
// failure report, and writes the case's dimensions to *size.
PropertyOutcome run_property_public(const std::string& name, const PropertyRun& run,
                                    const std::function<std::string(std::string* size)>& body);

// One line of dimensions for a config ("B=2 S=9 Q=6 H=8 V=17 layers=1 float32").
std::string config_size(const Config& c);

// Cases and seed for the test suites: DFLASH_CASES / DFLASH_SEED when set
// (the nightly suite raises the count and picks fresh seeds), else defaults.
PropertyRun run_from_env(int default_cases, uint64_t default_seed);

}  // namespace dflash::harness
