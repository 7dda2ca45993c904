#include "harness/audit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <unordered_set>

#include "core/batch.h"
#include "core/optim.h"
#include "harness/step_dump.h"

namespace dflash::harness {
namespace {

struct GraphFacts {
  std::unordered_set<const c10::TensorImpl*> leaves;  // AccumulateGrad variables
  int checkpoint_regions = 0;
  std::vector<std::string> broken_boundaries;
};

GraphFacts walk(const at::Tensor& loss) {
  GraphFacts f;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<const torch::autograd::Node*> stack{loss.grad_fn().get()};
  while (!stack.empty()) {
    const torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(n))
      f.leaves.insert(acc->variable.unsafeGetTensorImpl());
    if (n->name().rfind("CheckpointBackward", 0) == 0) {
      ++f.checkpoint_regions;
      for (const auto& e : n->next_edges())
        if (!e.is_valid()) f.broken_boundaries.push_back(n->name());
    }
    for (const auto& e : n->next_edges()) stack.push_back(e.function.get());
  }
  return f;
}

// Parameters whose gradient may legitimately be all zero in this step.
bool context_blind(const StepInputs& in) {
  return !((in.anchors.anchors > 0) & in.anchors.keep).any().item<bool>();
}

}  // namespace

bool AuditReport::has(char cls) const {
  const std::string tag = fmt::format("({})", cls);
  for (const auto& f : findings)
    if (f.rfind(tag, 0) == 0) return true;
  return false;
}

namespace {

// The verdict of a trainable row from its gradient facts (empty: ok).
std::string trainable_verdict(const AuditRow& r, double wsum, bool blind) {
  const bool may_be_zero =
      wsum == 0 || (blind && (r.name == "fc.weight" || r.name == "hidden_norm.weight"));
  if (!r.reachable) return "(a) not reachable from the loss";
  if (!r.grad_defined) return "(c) gradient undefined";
  if (!r.finite) return "(c) gradient not finite";
  if (r.grad_norm == 0 && !may_be_zero) return "(c) gradient exactly zero";
  if (r.grad_norm != 0 && wsum == 0) return "(c) gradient nonzero with no weighted position";
  return "";
}

void grad_facts(AuditRow& r, const at::Tensor& gr) {
  r.grad_defined = gr.defined();
  if (r.grad_defined) {
    r.finite = at::isfinite(gr).all().item<bool>();
    r.grad_norm = gr.to(at::kDouble).norm().item<double>();
  }
}

void check_trainable(AuditReport& rep, const DrafterWeights& w, const GraphFacts& g, double wsum,
                     bool blind) {
  for (auto& [name, p] : named(w)) {
    AuditRow r;
    r.name = name, r.trainable = true, r.shape = p.sizes().vec();
    r.reachable = g.leaves.count(p.unsafeGetTensorImpl()) > 0;
    grad_facts(r, p.grad());
    r.verdict = trainable_verdict(r, wsum, blind);
    rep.rows.push_back(r);
  }
}

void check_frozen(AuditReport& rep, const NamedTensors& frozen,
                  const std::vector<at::Tensor>& before, const GraphFacts& g) {
  for (size_t i = 0; i < frozen.size(); ++i) {
    const auto& [name, t] = frozen[i];
    AuditRow r;
    r.name = name, r.trainable = false, r.shape = t.sizes().vec();
    r.reachable = g.leaves.count(t.unsafeGetTensorImpl()) > 0;
    r.grad_defined = t.grad().defined();
    r.moved = !at::equal(t.detach(), before[i]);
    std::vector<std::string> why;
    if (t.requires_grad()) why.push_back("requires grad");
    if (r.reachable) why.push_back("reachable from the loss");
    if (r.grad_defined) why.push_back("has a gradient");
    if (r.moved) why.push_back("changed in the optimizer step");
    if (!why.empty()) r.verdict = fmt::format("(b) frozen tensor {}", fmt::join(why, ", "));
    rep.rows.push_back(r);
  }
}

void collect_findings(AuditReport& rep) {
  for (auto& r : rep.rows) {
    if (r.verdict.empty())
      r.verdict = "ok";
    else
      rep.findings.push_back(
          fmt::format("{} {}: {}", r.verdict.substr(0, 3), r.name, r.verdict.substr(4)));
  }
}

}  // namespace

AuditReport audit_step(const StepFn& fn, const Config& c, const DrafterWeights& w0,
                       const TargetWeights& target0, const StepInputs& in) {
  AuditReport rep;
  DrafterWeights w = clone(w0);
  TargetWeights target = target0;  // the frozen tensors themselves: a mutant may touch them
  NamedTensors frozen;
  visit(target, [&](const std::string& n, at::Tensor& t) { frozen.emplace_back(n, t); });
  std::vector<at::Tensor> before;
  for (auto& [n, t] : frozen) before.push_back(t.detach().clone());

  // Forward, backward, one AdamW step; a failure in any is a (d) finding and
  // the later stages are skipped, but the frozen tensors are checked anyway.
  GraphFacts g;
  try {
    const StepOutputs out = fn(c, w, target.frozen(), in);
    g = walk(out.loss);
    for (const auto& b : g.broken_boundaries)
      rep.findings.push_back(fmt::format("(d) {} has an input without a graph edge", b));
    try {
      out.loss.backward();
      check_trainable(rep, w, g, out.weight_sum.item<double>(), context_blind(in));
      AdamW(named(w), OptimConfig{}).step();
    } catch (const std::exception& e) {
      rep.findings.push_back(fmt::format("(d) backward failed: {}", e.what()));
    }
  } catch (const std::exception& e) {
    rep.findings.push_back(fmt::format("(d) the step failed: {}", e.what()));
  }
  rep.checkpoint_regions = g.checkpoint_regions;
  check_frozen(rep, frozen, before, g);
  collect_findings(rep);
  return rep;
}

AuditReport audit_recorded(const StepDump& d) {
  AuditReport rep;
  rep.recorded_from = d.path;
  const Config& c = d.config;
  const DraftLayout lay =
      make_draft_layout(d.inputs.input_ids, d.inputs.loss_mask, d.inputs.anchors, c.data.block_size,
                        c.data.mask_token_id, c.loss.gamma);
  const double wsum = lay.weights.sum().item<double>();
  const bool blind = context_blind(d.inputs);
  auto recorded = [&](const std::string& name) {
    const auto it = d.recorded.find("grad." + name);
    return it == d.recorded.end() ? at::Tensor() : it->second;
  };
  for (const auto& [name, p] : named(d.drafter)) {
    AuditRow r;
    r.name = name, r.trainable = true, r.shape = p.sizes().vec();
    grad_facts(r, recorded(name));
    r.reachable = r.grad_defined;
    r.verdict = r.reachable ? trainable_verdict(r, wsum, blind)
                            : "(a) no gradient recorded (not reachable from the trainer's loss)";
    rep.rows.push_back(r);
  }
  for (const auto& [name, t] : named(d.frozen)) {
    AuditRow r;
    r.name = name, r.trainable = false, r.shape = t.sizes().vec();
    grad_facts(r, recorded(name));
    r.reachable = r.grad_defined;
    if (r.grad_defined) r.verdict = "(b) frozen tensor has a recorded gradient (it required grad)";
    rep.rows.push_back(r);
  }
  collect_findings(rep);
  return rep;
}

std::string AuditReport::format() const {
  std::string s = fmt::format("{:<46} {:>9} {:>9} {:>5} {:>6} {:>12} {:>5}  {}\n", "tensor", "role",
                              "reachable", "grad", "finite", "|grad|", "moved", "verdict");
  for (const auto& r : rows)
    s += fmt::format("{:<46} {:>9} {:>9} {:>5} {:>6} {:>12.4e} {:>5}  {}\n", r.name,
                     r.trainable ? "trainable" : "frozen", r.reachable ? "yes" : "NO",
                     r.grad_defined ? "yes" : "-", r.finite ? "yes" : "NO", r.grad_norm,
                     r.moved ? "YES" : "no", r.verdict);
  if (recorded_from.empty())
    s += fmt::format("checkpointed regions in the graph: {}\n", checkpoint_regions);
  else
    s += "(a dump: reachable = a gradient was recorded; movement in an optimizer step and "
         "checkpoint boundaries are not recorded, so not audited)\n";
  if (findings.empty()) s += "audit: ok\n";
  for (const auto& f : findings) s += "finding " + f + "\n";
  return s;
}

}  // namespace dflash::harness
