#include "harness/dump_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "harness/parity.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

using TensorMap = std::map<std::string, at::Tensor>;

TensorMap by_name(const StepResult& r) {
  TensorMap m;
  for (auto& [name, t] : output_tensors(r.out)) m[name] = t.detach().to(at::kCPU);
  for (auto& [name, g] : r.grads)
    if (g.defined()) m["grad." + name] = g.detach().to(at::kCPU);
  return m;
}

Comparison failed(const std::string& name, const std::string& why) {
  Comparison c;
  c.name = name;
  c.message = why;
  return c;
}

// "" when every element is finite, else what is wrong and where.
std::string non_finite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return "";
  const at::Tensor bad = ~at::isfinite(t.to(at::kDouble)).reshape(-1);
  const int64_t n = bad.sum().item<int64_t>();
  if (n == 0) return "";
  const int64_t nan = at::isnan(t.to(at::kDouble)).sum().item<int64_t>();
  return fmt::format("not finite: {} NaN and {} inf of {} elements (first at flat index {})", nan,
                     n - nan, t.numel(), bad.nonzero()[0][0].item<int64_t>());
}

// Every structural problem of the recorded tensors, as failed rows; `want`
// gets the names whose values are then compared.
std::vector<Comparison> structure(const StepDump& d, const TensorMap& shapes, bool all_outputs,
                                  std::vector<std::string>& want) {
  std::vector<Comparison> bad;
  std::set<std::string> trainable;
  for (const ParamSpec& s : drafter_specs(d.config)) trainable.insert("grad." + s.name);
  std::set<std::string> frozen;
  for (const ParamSpec& s : frozen_specs(d.config)) frozen.insert("grad." + s.name);
  for (const std::string& n : d.unknown)
    bad.push_back(failed(n, "unknown tensor (not input.*, a weight, output.* or grad.*)"));
  for (const auto& [name, t] : d.recorded) {
    if (frozen.count(name)) {
      bad.push_back(failed(name,
                           "a frozen weight has a gradient (SPEC: the borrowed embedding "
                           "and LM head get none)"));
    } else if (!shapes.count(name) && !trainable.count(name)) {
      bad.push_back(
          failed(name, name.rfind("grad.", 0) == 0
                           ? "gradient of no trainable parameter"
                           : "unknown output (see output_tensors in harness/step_dump.h)"));
    }
  }
  for (const auto& [name, ref] : shapes) {
    const bool optional = !all_outputs && name.rfind("grad.", 0) != 0 && name != "output.loss" &&
                          name != "output.student_hidden";
    auto it = d.recorded.find(name);
    if (it == d.recorded.end()) {
      if (!optional) bad.push_back(failed(name, "missing: the dump records no such tensor"));
      continue;
    }
    const at::Tensor& t = it->second;
    if (t.sizes() != ref.sizes()) {
      bad.push_back(
          failed(name, fmt::format("shape ({}), expected ({})", fmt::join(t.sizes(), ", "),
                                   fmt::join(ref.sizes(), ", "))));
    } else if (!at::isFloatingType(t.scalar_type())) {
      bad.push_back(failed(
          name, fmt::format("dtype {}, expected a floating dtype", at::toString(t.scalar_type()))));
    } else if (const std::string nf = non_finite(t); !nf.empty()) {
      bad.push_back(failed(name, nf));
    } else {
      want.push_back(name);
    }
  }
  return bad;
}

Comparison bitwise(const std::string& name, const at::Tensor& recorded, const at::Tensor& now) {
  Comparison c;
  c.name = name;
  const at::Tensor n = now.to(recorded.scalar_type());
  const at::Tensor d = (n.to(at::kDouble) - recorded.to(at::kDouble)).abs().reshape(-1);
  c.shape = recorded.sizes().vec();
  if (d.numel()) {
    c.worst_index = d.argmax().item<int64_t>();
    c.err = d[c.worst_index].item<double>();
    c.worst_candidate = n.to(at::kDouble).reshape(-1)[c.worst_index].item<double>();
    c.worst_reference = recorded.to(at::kDouble).reshape(-1)[c.worst_index].item<double>();
    const double scale = recorded.to(at::kDouble).abs().max().item<double>();
    c.rel_err = scale > 0 ? c.err / scale : c.err;
  }
  c.ok = at::equal(n, recorded.contiguous());
  if (!c.ok && c.err == 0) c.message = "differs in bits (e.g. the sign of a zero)";
  return c;
}

}  // namespace

DumpMode parse_dump_mode(const std::string& s) {
  if (s == "auto") return DumpMode::kAuto;
  if (s == "bitwise") return DumpMode::kBitwise;
  if (s == "tolerance") return DumpMode::kTolerance;
  throw std::invalid_argument("--compare: expected auto, bitwise or tolerance, got '" + s + "'");
}

namespace {

// The dump as a float64 parity case (harness/parity.h): its own inputs,
// weights and anchors. The target's layers are not in a dump and not needed.
StepCase case_of(const StepDump& d) {
  StepCase c;
  c.config = d.config;
  c.config.run.dtype = DType::kFloat64;
  c.target.embed_tokens = d.frozen.embed_tokens.to(at::kDouble);
  c.target.lm_head = d.frozen.lm_head.is_same(d.frozen.embed_tokens)
                         ? c.target.embed_tokens
                         : d.frozen.lm_head.to(at::kDouble);
  c.target.norm = at::ones({d.config.target.shape.hidden_size}, at::kDouble);
  c.drafter = clone(d.drafter);
  visit(c.drafter, [](const std::string&, at::Tensor& t) {
    t = t.detach().to(at::kDouble).clone().requires_grad_(true);
  });
  c.inputs = d.inputs;
  c.inputs.features = d.inputs.features.to(at::kDouble);
  c.inputs.target_hidden = d.inputs.target_hidden.to(at::kDouble);
  return c;
}

// Metrics are ratios of argmax counts: exact but for near ties.
Comparison metric(const std::string& name, const at::Tensor& rec, const at::Tensor& ref,
                  const at::Tensor& slack) {
  Comparison c;
  c.name = name;
  c.shape = rec.sizes().vec();
  const at::Tensor d = (rec.to(at::kDouble) - ref.to(at::kDouble)).abs().reshape(-1);
  const at::Tensor s = slack.to(at::kDouble).reshape(-1).expand_as(d) + 1e-9;
  c.worst_index = (d - s).argmax().item<int64_t>();
  c.err = d[c.worst_index].item<double>();
  c.bound = s[c.worst_index].item<double>();
  c.worst_candidate = rec.to(at::kDouble).reshape(-1)[c.worst_index].item<double>();
  c.worst_reference = ref.to(at::kDouble).reshape(-1)[c.worst_index].item<double>();
  c.ok = (d <= s).all().item<bool>();
  if (!c.ok)
    c.message = fmt::format(
        "differs by {:.6g} where near ties allow {:.6g} (index {}: {:.6g} vs "
        "{:.6g})",
        c.err, c.bound, c.worst_index, c.worst_candidate, c.worst_reference);
  return c;
}

void compare_by_tolerance(const StepDump& d, const std::vector<std::string>& names,
                          ComparisonReport& rep, std::string& mode) {
  const DtypeRule& rule = dtype_rule(d.config.run.dtype);
  mode = fmt::format("error ratio ({} rule: {})", dtype_name(d.config.run.dtype), rule.why);
  const StepCase c64 = case_of(d);
  const StepResult r64 = run_case(reference::drafter_step, c64);
  std::vector<TensorMap> same;
  if (d.config.run.dtype == DType::kFloat64) {
    same.push_back(by_name(r64));
  } else {
    same.push_back(by_name(run_case(reference::drafter_step, as_dtype(c64, d.config.run.dtype))));
    for (uint64_t k = 1; k <= 2; ++k)
      same.push_back(
          by_name(run_case(reference::drafter_step,
                           as_dtype(perturbed(c64, rule.rounding, k), d.config.run.dtype))));
  }
  const TensorMap ref = by_name(r64);
  // TV's sign ambiguity (harness/parity.h), judged from the dump's own
  // student hidden state when it recorded a usable one.
  StepResult cand;
  if (std::find(names.begin(), names.end(), "output.student_hidden") != names.end())
    cand.out.student_hidden = d.recorded.at("output.student_hidden");
  const std::map<std::string, at::Tensor> slack = tv_sign_slack(c64, cand, rule);
  const at::Tensor ties = near_ties(c64, r64, rule.logit_noise);  // (bs)
  const int64_t bs = ties.numel();
  const double kept = std::max<int64_t>(r64.out.kept_blocks.item<int64_t>(), 1);
  const at::Tensor counted = r64.out.counted.clamp_min(1).to(at::kDouble);
  for (const std::string& n : names) {
    const at::Tensor& rec = d.recorded.at(n);
    if (n == "output.tau") {
      rep.rows.push_back(metric(n, rec, ref.at(n), ties.sum().to(at::kDouble) * (bs - 1) / kept));
    } else if (n == "output.accuracy") {
      rep.rows.push_back(metric(n, rec, ref.at(n), ties.to(at::kDouble) / counted));
    } else {
      std::vector<at::Tensor> s;
      for (const TensorMap& m : same) s.push_back(m.at(n));
      const bool nats = n != "output.student_hidden" && n.rfind("grad.", 0) != 0;
      auto sl = slack.find(n);
      rep.rows.push_back(compare(n, rec, s, ref.at(n), nats ? loss_tolerance(rule.tol) : rule.tol,
                                 sl == slack.end() ? at::Tensor() : sl->second));
    }
  }
}

}  // namespace

DumpCheck check_step_dump(const StepDump& d, const StepResult& recomputed, DumpMode mode) {
  DumpCheck out;
  out.file = d.path;
  if (mode == DumpMode::kAuto)
    mode = d.producer.rfind(kDflashProducer, 0) == 0 ? DumpMode::kBitwise : DumpMode::kTolerance;
  const TensorMap now = by_name(recomputed);
  std::vector<std::string> names;
  out.report.rows = structure(d, now, mode == DumpMode::kBitwise, names);
  if (mode == DumpMode::kBitwise) {
    out.mode = "bit for bit (dflash's own dump, recomputed by the same build)";
    for (const std::string& n : names)
      out.report.rows.push_back(bitwise(n, d.recorded.at(n), now.at(n)));
  } else {
    compare_by_tolerance(d, names, out.report, out.mode);
  }
  return out;
}

std::string DumpCheck::format(size_t rows) const {
  std::vector<const Comparison*> order;
  for (const Comparison& c : report.rows) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const Comparison* a, const Comparison* b) {
    if (a->ok != b->ok) return !a->ok;
    const double ra = a->message.empty() ? a->error_ratio() : 0;
    const double rb = b->message.empty() ? b->error_ratio() : 0;
    return ra > rb;
  });
  size_t bad = 0;
  for (const Comparison* c : order) bad += !c->ok;
  std::string s = fmt::format("  compare {} ({}): {} tensors, {} failed; worst first\n", file, mode,
                              order.size(), bad);
  for (size_t i = 0; i < order.size() && i < std::max(rows, bad); ++i)
    s += "  " + order[i]->describe() + "\n";
  if (order.size() > std::max(rows, bad))
    s += fmt::format("  ... {} more, all within their bound\n", order.size() - std::max(rows, bad));
  const bool bits = mode.rfind("bit for bit", 0) == 0;
  const std::pair<const char*, const char*> who =
      bits ? std::make_pair("recomputed", "recorded")
           : std::make_pair("recorded", "float64 reference");
  for (const Comparison* c : order)
    if (!c->ok)
      s += fmt::format("{}: tensor '{}': {}\n", file, c->name,
                       c->message.empty()
                           ? fmt::format("max |difference| {:.3e} over the bound {:.3e} at flat "
                                         "index {} ({} {:.9g} vs {} {:.9g})",
                                         c->err, c->bound, c->worst_index, who.first,
                                         c->worst_candidate, who.second, c->worst_reference)
                           : c->message);
  s += fmt::format("  verdict: {}\n", ok() ? "the dump agrees" : "the dump DIFFERS");
  return s;
}

}  // namespace dflash::harness
