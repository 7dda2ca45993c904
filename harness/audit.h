// The requires_grad audit: walks the autograd graph from the loss and checks
// that every trainable parameter is connected to it and every frozen tensor is
// not, that gradients are present, finite and nonzero where the configuration
// says they must be, that frozen tensors neither get a gradient nor move in an
// optimizer step, and that checkpoint boundaries keep their inputs' graphs.
//
// The findings, by class:
//   (a) a trainable parameter not reachable from the loss;
//   (b) a frozen tensor (embedding, LM head, any target weight) that requires
//       grad, is reachable, ends with a gradient, or changes in an AdamW step;
//   (c) a trainable gradient that is undefined, non-finite, or exactly zero
//       where it cannot be. The rule: when the step carries weight (sum w > 0)
//       every gradient is nonzero, except that fc.weight and
//       hidden_norm.weight may be zero when no kept block has an anchor > 0
//       (no draft position sees context); when sum w = 0 every gradient is 0;
//   (d) a checkpoint boundary whose differentiable input does not require
//       grad or has lost its graph (the contract error, or a
//       CheckpointBackward node with a missing edge).
#pragma once

#include <string>
#include <vector>

#include "core/step.h"

namespace dflash::harness {

struct AuditRow {
  std::string name;
  bool trainable = false;
  std::vector<int64_t> shape;
  bool reachable = false;
  bool grad_defined = false;
  bool finite = true;
  double grad_norm = 0;
  bool moved = false;   // after one AdamW step
  std::string verdict;  // "ok" or the finding class and reason
};

struct AuditReport {
  std::vector<AuditRow> rows;
  std::vector<std::string> findings;  // "(a) ...", "(b) ...", ...
  int checkpoint_regions = 0;         // CheckpointBackward nodes in the graph
  std::string recorded_from;          // audit_recorded: the dump's path (empty: a live step)
  bool ok() const { return findings.empty(); }
  bool has(char cls) const;    // a finding of class 'a'..'d'
  std::string format() const;  // the per-parameter table and findings
};

// Runs one step of `fn` (forward, backward, AdamW step) on a copy of the
// trainable weights; the frozen tensors are the caller's own (that is what
// is being audited), so a step that moves them moves the caller's.
AuditReport audit_step(const StepFn& fn, const Config& c, const DrafterWeights& w,
                       const TargetWeights& target, const StepInputs& in);

struct StepDump;

// The same rules (a)-(c) on the gradients another trainer recorded in a step
// dump (`dflash audit --from FILE`, docs/PYTORCH.md): a trainable parameter
// without a recorded gradient is (a), a recorded gradient of a frozen tensor
// (b), an undefined / non-finite / wrongly zero one (c), the zero rule taken
// from the dump's own inputs. A dump records neither the graph nor the
// optimizer step: reachability means "a gradient was recorded", movement and
// checkpoint boundaries (d) are not audited (the table says so).
AuditReport audit_recorded(const StepDump& d);

}  // namespace dflash::harness
