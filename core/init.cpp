#include "core/init.h"

#include <map>
#include <string>

#include "core/step.h"

namespace dflash {

at::Tensor seeded_tensor(const ParamSpec& spec, uint64_t seed, double std, double jitter,
                         at::ScalarType dtype) {
  Rng rng(derive_seed(seed, spec.name));
  at::Tensor t = at::empty(spec.shape, at::kDouble);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    p[i] = spec.is_norm ? 1.0 + jitter * rng.normal() : std * rng.normal();
  return t.to(dtype);
}

TargetWeights make_target(const Config& c) {
  const at::ScalarType dt = scalar_type(c.run.dtype);
  std::map<std::string, at::Tensor> made;
  for (const ParamSpec& s : target_specs(c))
    made[s.name] = seeded_tensor(s, c.run.seed, c.target.init_std, c.target.norm_init_jitter, dt);
  TargetWeights w;
  w.qk_norm = c.target.shape.qk_norm;
  w.layers.resize(size_t(c.target.num_hidden_layers));
  visit(w, [&](const std::string& n, at::Tensor& t) { t = made.at(n); });
  if (c.target.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

DrafterWeights make_drafter(const Config& c) {
  const at::ScalarType dt = master_type(c.run.dtype);
  std::map<std::string, at::Tensor> made;
  for (const ParamSpec& s : drafter_specs(c))
    made[s.name] = seeded_tensor(s, c.run.seed, c.drafter.init_std, c.drafter.norm_init_jitter, dt)
                       .requires_grad_(true);
  DrafterWeights w;
  w.layers.resize(size_t(c.drafter.num_hidden_layers));
  visit(w, [&](const std::string& n, at::Tensor& t) { t = made.at(n); });
  return w;
}

Anchors step_anchors(const Config& c, const at::Tensor& loss_mask, const char* stream,
                     uint64_t index) {
  Rng rng(derive_seed(c.run.seed, stream, index));
  return sample_anchors(loss_mask, c.data.max_anchors, rng);
}

}  // namespace dflash
