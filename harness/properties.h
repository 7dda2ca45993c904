// The parity properties, runnable from code with a chosen case count and seed
// (RapidCheck's checkProperty), so that ctest, `dflash parity` and the bug
// zoo all run the very same checks. A failure is shrunk by RapidCheck; the
// outcome carries the minimal counterexample as a replayable TOML (a config
// for the step property, a `[case]` table for a component property, see
// harness/component_properties.h) and the comparison table of that case.
// Nothing in the failure path throws: an exception inside a case is that
// case's failure report. RapidCheck's own reporting is silenced: the
// outcome is the report.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "core/step.h"
#include "optimized/checkpoint.h"
#include "optimized/kernels.h"

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
  std::string counterexample;  // minimal failing case, replayable TOML (see above)
  std::string size;            // its dimensions, one line
  uint64_t seed = 0;
  double seconds = 0;
};

// Signatures of the swappable components (the optimized twins).
using LossFn = std::function<StepOutputs(const Config&, const at::Tensor& student_hidden,
                                         const at::Tensor& target_hidden, const at::Tensor& lm_head,
                                         const DraftLayout&, const Anchors&)>;
using AttentionFn = std::function<at::Tensor(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Anchors& a,
    int64_t seq_len, int64_t block_size, int64_t tile, optimized::Kernels kernels)>;
using CheckpointImpl =
    std::function<at::Tensor(const optimized::CheckpointContract&, const optimized::CheckpointFn&)>;

// Whole step: generated configs (gen_step_config) through step_parity.
PropertyOutcome check_step_parity(const StepFn& candidate, const PropertyRun& run,
                                  const std::string& name = "parity.step");
// Components against their reference twins, float64 and float32, random
// (non-uniform) upstream gradients.
// `fixed`, when given, overrides what the loss cases draw (the per-objective
// error ratios of `dflash parity --measure-tolerances`): `objective` sets the
// [loss] objective or weighting over the drawn one, `dtype` the precision,
// `near_agreement` whether the student's hidden states are the teacher's
// plus 1e-3 noise (p_s ~ p_t: the KL-cancellation regime; otherwise drawn,
// one float64 case in four).
struct LossCaseOverride {
  std::function<void(LossConfig&)> objective;
  std::optional<DType> dtype;
  std::optional<bool> near_agreement;
};
PropertyOutcome check_loss_parity(const LossFn& candidate, const PropertyRun& run,
                                  const std::string& name = "parity.loss",
                                  const LossCaseOverride& fixed = {});
PropertyOutcome check_attention_parity(const AttentionFn& candidate, const PropertyRun& run,
                                       const std::string& name = "parity.attention");
PropertyOutcome check_checkpoint_parity(const CheckpointImpl& candidate, const PropertyRun& run,
                                        const std::string& name = "parity.checkpoint");

// Component counterexamples: a TOML `[case]` table naming the component
// (loss, attention, checkpoint), its shapes, dtype, seeds and masks; what
// `dflash parity --reproduce FILE` replays.
struct ComponentImpls {
  LossFn loss;
  AttentionFn attention;
  CheckpointImpl checkpoint;
};
// The component a counterexample text names, "" for a step config.
std::string case_component(const std::string& toml_text);
// Parses and checks one component case (sizes bounded, anchors, masks and
// keep in range) without running it; returns the component. Throws
// std::runtime_error naming file and key on a malformed or oversized case.
std::string validate_component_case(const std::string& toml_text, const std::string& label);
// Replays one component case against `impls`: "" when it passes, else the
// comparison report. Throws on a malformed file, naming file and key.
std::string replay_component_case(const std::string& toml_text, const std::string& label,
                                  const ComponentImpls& impls, std::string* size);

// Runs `body` as a RapidCheck property; `body` returns "" on success or the
// failure report, writes the case's dimensions to *size and, before it can
// fail, the TOML that replays the case to *replay.
using PropertyBody = std::function<std::string(std::string* size, std::string* replay)>;
PropertyOutcome run_property_public(const std::string& name, const PropertyRun& run,
                                    const PropertyBody& body);

// Writes a failed outcome's counterexample to OUT_DIR/counterexample-NAME.toml
// and returns the lines that say where it is and how to replay it (with
// `--mutant MUTANT` when one was checked); never throws: when the file
// cannot be written, the lines say why and carry the TOML itself.
std::string save_counterexample(const PropertyOutcome& o, const std::string& out_dir,
                                const std::string& mutant = "");

// One line of dimensions for a config ("B=2 S=9 Q=6 H=8 V=17 layers=1 float32").
std::string config_size(const Config& c);

// Cases and seed for the test suites: DFLASH_CASES / DFLASH_SEED when set
// (the nightly suite raises the count and picks fresh seeds), else defaults.
PropertyRun run_from_env(int default_cases, uint64_t default_seed);

}  // namespace dflash::harness
