// Model weights as plain structs, with the SPEC.md / Hugging Face names in one
// table so that dumps, checkpoints and the audit all agree on them.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace dflash {

// One decoder layer (target and drafter share the shape). Linear weights are
// (out_features, in_features).
struct DecoderLayerWeights {
  at::Tensor input_layernorm;           // (H)
  at::Tensor q_proj;                    // (nh*hd, H)
  at::Tensor k_proj;                    // (nkv*hd, H)
  at::Tensor v_proj;                    // (nkv*hd, H)
  at::Tensor o_proj;                    // (H, nh*hd)
  at::Tensor q_norm;                    // (hd)
  at::Tensor k_norm;                    // (hd)
  at::Tensor post_attention_layernorm;  // (H)
  at::Tensor gate_proj;                 // (I, H)
  at::Tensor up_proj;                   // (I, H)
  at::Tensor down_proj;                 // (H, I)
};

// Trainable drafter parameters.
struct DrafterWeights {
  at::Tensor fc;           // (H, L*H)
  at::Tensor hidden_norm;  // (H)
  std::vector<DecoderLayerWeights> layers;
  at::Tensor norm;  // (H)
};

// Borrowed from the target, frozen: never trained, never in a drafter checkpoint.
struct FrozenWeights {
  at::Tensor embed_tokens;  // (V, H)
  at::Tensor lm_head;       // (V, H); the same tensor as embed_tokens when tied
};

struct TargetWeights {
  at::Tensor embed_tokens;  // (V, H)
  std::vector<DecoderLayerWeights> layers;
  at::Tensor norm;      // (H)
  at::Tensor lm_head;   // (V, H)
  bool qk_norm = true;  // false (Llama): the layers' q_norm / k_norm are absent
  FrozenWeights frozen() const { return {embed_tokens, lm_head}; }
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm;  // RMSNorm weight (init 1), else a matrix (init N(0, std))
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// "[2, 3]": a shape in messages.
std::string shape_text(at::IntArrayRef shape);
using TensorVisitor = std::function<void(const std::string& name, at::Tensor& t)>;

// Drafter: fc.weight, hidden_norm.weight, layers.{i}.*, norm.weight.
std::vector<ParamSpec> drafter_specs(const Config& c);
void visit(DrafterWeights& w, const TensorVisitor& f);
// One decoder layer, names prefixed by `prefix` (e.g. "layers.3.").
void visit(DecoderLayerWeights& l, const std::string& prefix, const TensorVisitor& f);
NamedTensors named(const DrafterWeights& w);
// Frozen pair under their SPEC.md names: embed_tokens.weight, lm_head.weight.
std::vector<ParamSpec> frozen_specs(const Config& c);
NamedTensors named(const FrozenWeights& w);
// Target: Hugging Face names (model.embed_tokens.weight, model.layers.{i}.*,
// model.norm.weight, lm_head.weight).
std::vector<ParamSpec> target_specs(const Config& c);
void visit(TargetWeights& w, const TensorVisitor& f);

// Builds the struct from named tensors, checking every name is present with
// its spec shape and converting to `dtype`; errors name `label` and the tensor.
DrafterWeights bind_drafter(const Config& c, const std::map<std::string, at::Tensor>& src,
                            at::ScalarType dtype, const std::string& label);
FrozenWeights bind_frozen(const Config& c, const std::map<std::string, at::Tensor>& src,
                          at::ScalarType dtype, const std::string& label);

// Mixed precision: trainable masters live in master_type (fp32 for a
// bfloat16 run, else the run dtype); each step computes with a
// differentiable cast to the run dtype, so gradients land in the masters.
at::ScalarType master_type(DType run_dtype);
DrafterWeights cast(const DrafterWeights& w, at::ScalarType dtype);

// Deep copy (detached, same requires_grad), for snapshots and finite differences.
DrafterWeights clone(const DrafterWeights& w);

}  // namespace dflash
