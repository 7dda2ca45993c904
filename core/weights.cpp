#include "core/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dflash {
namespace {

using LayerMember = at::Tensor DecoderLayerWeights::*;
struct LayerField {
  const char* suffix;
  LayerMember member;
};
// The one place that maps SPEC.md layer names to struct members.
const LayerField kLayerFields[] = {
    {"input_layernorm.weight", &DecoderLayerWeights::input_layernorm},
    {"self_attn.q_proj.weight", &DecoderLayerWeights::q_proj},
    {"self_attn.k_proj.weight", &DecoderLayerWeights::k_proj},
    {"self_attn.v_proj.weight", &DecoderLayerWeights::v_proj},
    {"self_attn.o_proj.weight", &DecoderLayerWeights::o_proj},
    {"self_attn.q_norm.weight", &DecoderLayerWeights::q_norm},
    {"self_attn.k_norm.weight", &DecoderLayerWeights::k_norm},
    {"post_attention_layernorm.weight", &DecoderLayerWeights::post_attention_layernorm},
    {"mlp.gate_proj.weight", &DecoderLayerWeights::gate_proj},
    {"mlp.up_proj.weight", &DecoderLayerWeights::up_proj},
    {"mlp.down_proj.weight", &DecoderLayerWeights::down_proj},
};

bool is_qk_norm(const LayerField& f) {
  return f.member == &DecoderLayerWeights::q_norm || f.member == &DecoderLayerWeights::k_norm;
}

void add_layer_specs(std::vector<ParamSpec>& out, const std::string& prefix, const LayerShape& s) {
  const int64_t H = s.hidden_size, hd = s.head_dim, I = s.intermediate_size;
  const int64_t qd = s.num_attention_heads * hd, kvd = s.num_key_value_heads * hd;
  const std::vector<std::vector<int64_t>> shapes = {
      {H}, {qd, H}, {kvd, H}, {kvd, H}, {H, qd}, {hd}, {hd}, {H}, {I, H}, {I, H}, {H, I}};
  for (size_t i = 0; i < shapes.size(); ++i)
    if (s.qk_norm || !is_qk_norm(kLayerFields[i]))
      out.push_back({prefix + kLayerFields[i].suffix, shapes[i], shapes[i].size() == 1});
}

void visit_layer(DecoderLayerWeights& l, const std::string& prefix, const TensorVisitor& f,
                 bool qk_norm) {
  for (const auto& field : kLayerFields)
    if (qk_norm || !is_qk_norm(field)) f(prefix + field.suffix, l.*field.member);
}

at::Tensor take(const std::map<std::string, at::Tensor>& src, const ParamSpec& spec,
                at::ScalarType dtype, const std::string& label) {
  auto it = src.find(spec.name);
  if (it == src.end())
    throw std::runtime_error(fmt::format("{}: missing tensor '{}'", label, spec.name));
  if (it->second.sizes().vec() != spec.shape)
    throw std::runtime_error(fmt::format("{}: tensor '{}': expected shape {}, found {}", label,
                                         spec.name, shape_text(spec.shape),
                                         shape_text(it->second.sizes())));
  if (!it->second.is_floating_point())
    throw std::runtime_error(fmt::format("{}: tensor '{}': expected a floating dtype, found {}",
                                         label, spec.name, at::toString(it->second.scalar_type())));
  return it->second.detach().to(dtype).contiguous().clone();
}

}  // namespace

void visit(DecoderLayerWeights& l, const std::string& prefix, const TensorVisitor& f) {
  visit_layer(l, prefix, f, true);
}

std::vector<ParamSpec> drafter_specs(const Config& c) {
  const int64_t H = c.drafter.shape.hidden_size;
  std::vector<ParamSpec> out = {{"fc.weight", {H, c.num_taps() * H}, false},
                                {"hidden_norm.weight", {H}, true}};
  for (int64_t i = 0; i < c.drafter.num_hidden_layers; ++i)
    add_layer_specs(out, fmt::format("layers.{}.", i), c.drafter.shape);
  out.push_back({"norm.weight", {H}, true});
  return out;
}

void visit(DrafterWeights& w, const TensorVisitor& f) {
  f("fc.weight", w.fc);
  f("hidden_norm.weight", w.hidden_norm);
  for (size_t i = 0; i < w.layers.size(); ++i) visit(w.layers[i], fmt::format("layers.{}.", i), f);
  f("norm.weight", w.norm);
}

std::string shape_text(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

NamedTensors named(const DrafterWeights& w) {
  NamedTensors out;
  visit(const_cast<DrafterWeights&>(w),
        [&](const std::string& n, at::Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<ParamSpec> frozen_specs(const Config& c) {
  const int64_t V = c.target.vocab_size, H = c.target.shape.hidden_size;
  return {{"embed_tokens.weight", {V, H}, false}, {"lm_head.weight", {V, H}, false}};
}

NamedTensors named(const FrozenWeights& w) {
  return {{"embed_tokens.weight", w.embed_tokens}, {"lm_head.weight", w.lm_head}};
}

std::vector<ParamSpec> target_specs(const Config& c) {
  const int64_t V = c.target.vocab_size, H = c.target.shape.hidden_size;
  std::vector<ParamSpec> out = {{"model.embed_tokens.weight", {V, H}, false}};
  for (int64_t i = 0; i < c.target.num_hidden_layers; ++i)
    add_layer_specs(out, fmt::format("model.layers.{}.", i), c.target.shape);
  out.push_back({"model.norm.weight", {H}, true});
  out.push_back({"lm_head.weight", {V, H}, false});
  return out;
}

void visit(TargetWeights& w, const TensorVisitor& f) {
  f("model.embed_tokens.weight", w.embed_tokens);
  for (size_t i = 0; i < w.layers.size(); ++i)
    visit_layer(w.layers[i], fmt::format("model.layers.{}.", i), f, w.qk_norm);
  f("model.norm.weight", w.norm);
  f("lm_head.weight", w.lm_head);
}

DrafterWeights bind_drafter(const Config& c, const std::map<std::string, at::Tensor>& src,
                            at::ScalarType dtype, const std::string& label) {
  std::map<std::string, at::Tensor> taken;
  for (const ParamSpec& s : drafter_specs(c)) taken[s.name] = take(src, s, dtype, label);
  DrafterWeights w;
  w.layers.resize(size_t(c.drafter.num_hidden_layers));
  visit(w, [&](const std::string& n, at::Tensor& t) { t = taken.at(n); });
  return w;
}

FrozenWeights bind_frozen(const Config& c, const std::map<std::string, at::Tensor>& src,
                          at::ScalarType dtype, const std::string& label) {
  auto specs = frozen_specs(c);
  return {take(src, specs[0], dtype, label), take(src, specs[1], dtype, label)};
}

at::ScalarType master_type(DType run_dtype) {
  return run_dtype == DType::kFloat64 ? at::kDouble : at::kFloat;
}

DrafterWeights cast(const DrafterWeights& w, at::ScalarType dtype) {
  DrafterWeights out = w;
  visit(out, [&](const std::string&, at::Tensor& t) { t = t.to(dtype); });
  return out;
}

DrafterWeights clone(const DrafterWeights& w) {
  DrafterWeights out = w;
  visit(out, [](const std::string&, at::Tensor& t) {
    const bool rg = t.requires_grad();
    t = t.detach().clone();
    if (rg) t.requires_grad_(true);
  });
  return out;
}

}  // namespace dflash
