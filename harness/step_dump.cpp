#include "harness/step_dump.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>
#include <set>

#include "core/safetensors.h"

namespace dflash::harness {

const char* const kDflashProducer = "dflash dump (reference build)";

NamedTensors output_tensors(const StepOutputs& o) {
  return {{"output.loss", o.loss.detach()},
          {"output.ce", o.ce},
          {"output.kl", o.kl},
          {"output.reverse_kl", o.reverse_kl},
          {"output.jsd", o.jsd},
          {"output.tv", o.tv},
          {"output.tau", at::scalar_tensor(o.tau(), at::kDouble)},
          {"output.accuracy", o.accuracy()},
          {"output.student_hidden", o.student_hidden}};
}

void write_step_dump(const std::string& path, const Config& c, const DrafterWeights& w,
                     const FrozenWeights& f, const StepInputs& in, const StepResult& r) {
  NamedTensors t = {
      {"input.input_ids", in.input_ids},     {"input.loss_mask", in.loss_mask},
      {"input.features", in.features},       {"input.target_hidden", in.target_hidden},
      {"input.anchors", in.anchors.anchors}, {"input.keep", in.anchors.keep}};
  for (auto& p : named(w)) t.push_back(p);
  for (auto& p : named(f)) t.push_back(p);
  for (auto& p : output_tensors(r.out)) t.push_back(p);
  for (auto& [name, g] : r.grads)
    if (g.defined()) t.emplace_back("grad." + name, g);
  safetensors::write(path, t, {{"config", config_to_json(c).dump()},
                                {"format", "dflash-step-v1"},
                                {"producer", kDflashProducer}});
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& name, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: tensor '{}': {}", path, name, what));
}

at::Tensor expect(const safetensors::File& f, const std::string& name, std::vector<int64_t> shape,
                  at::ScalarType to) {
  const at::Tensor& t = f.get(name);
  if (t.sizes().vec() != shape)
    bad(f.label, name,
        fmt::format("expected shape ({}), found ({})", fmt::join(shape, ", "),
                    fmt::join(t.sizes(), ", ")));
  const bool want_float = at::isFloatingType(to);
  if (want_float != at::isFloatingType(t.scalar_type()))
    bad(f.label, name,
        fmt::format("expected a {} dtype, found {}", want_float ? "floating" : "integer or bool",
                    at::toString(t.scalar_type())));
  return t.to(to).contiguous();
}

void check_range(const std::string& label, const std::string& name, const at::Tensor& t, int64_t lo,
                 int64_t hi) {
  if (t.numel() == 0) return;
  const int64_t mn = t.min().item<int64_t>(), mx = t.max().item<int64_t>();
  if (mn < lo || mx > hi)
    bad(label, name, fmt::format("values must lie in [{}, {}], found [{}, {}]", lo, hi, mn, mx));
}

StepInputs read_inputs(const safetensors::File& f, const Config& c) {
  const int64_t B = c.data.batch_size, S = c.data.seq_len, H = c.target.shape.hidden_size;
  const at::ScalarType dt = scalar_type(c.run.dtype);
  StepInputs in;
  in.input_ids = expect(f, "input.input_ids", {B, S}, at::kLong);
  check_range(f.label, "input.input_ids", in.input_ids, 0, c.target.vocab_size - 1);
  in.loss_mask = expect(f, "input.loss_mask", {B, S}, at::kBool);
  in.features = expect(f, "input.features", {B, S, c.num_taps() * H}, dt);
  in.target_hidden = expect(f, "input.target_hidden", {B, S, H}, dt);
  const int64_t N = f.get("input.anchors").dim() == 2 ? f.get("input.anchors").size(1) : -1;
  in.anchors.anchors = expect(f, "input.anchors", {B, N}, at::kLong);
  check_range(f.label, "input.anchors", in.anchors.anchors, 0, S - 1);
  in.anchors.keep = expect(f, "input.keep", {B, N}, at::kBool);
  return in;
}

}  // namespace

StepDump read_step_dump(const std::string& path) {
  const safetensors::File f = safetensors::read(path);
  nlohmann::json cj;
  try {
    cj = nlohmann::json::parse(f.meta("config"));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("{}: __metadata__.config: not valid JSON: {}", path, e.what()));
  }
  StepDump d;
  d.config = parse_config_json(cj, path + ":__metadata__.config");
  std::map<std::string, at::Tensor> by_name(f.tensors.begin(), f.tensors.end());
  d.drafter = bind_drafter(d.config, by_name, master_type(d.config.run.dtype), path);
  visit(d.drafter, [](const std::string&, at::Tensor& t) { t.requires_grad_(true); });
  d.frozen = bind_frozen(d.config, by_name, scalar_type(d.config.run.dtype), path);
  d.inputs = read_inputs(f, d.config);
  d.path = path;
  d.producer = f.metadata.count("producer") ? f.metadata.at("producer") : "";
  std::set<std::string> weights;
  for (const auto& [name, t] : named(d.drafter)) weights.insert(name);
  for (const auto& [name, t] : named(d.frozen)) weights.insert(name);
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind("output.", 0) == 0 || name.rfind("grad.", 0) == 0)
      d.recorded[name] = t;
    else if (name.rfind("input.", 0) != 0 && !weights.count(name))
      d.unknown.push_back(name);
  }
  return d;
}

}  // namespace dflash::harness
