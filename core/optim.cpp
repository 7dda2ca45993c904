#include "core/optim.h"

#include <cmath>
#include <stdexcept>

#include "core/safetensors.h"

namespace dflash {

OptimConfig optim_config(const TrainConfig& t) {
  OptimConfig o;
  o.lr = t.lr;
  o.beta1 = t.beta1, o.beta2 = t.beta2;
  o.weight_decay = t.weight_decay;
  o.clip_norm = t.clip_norm;
  o.warmup_steps = t.warmup_steps;
  o.total_steps = t.steps;
  o.min_lr_ratio = t.min_lr_ratio;
  return o;
}

AdamW::AdamW(const NamedTensors& params, const OptimConfig& cfg) : params_(params), cfg_(cfg) {
  for (const auto& [name, p] : params_) {
    TORCH_CHECK(p.requires_grad(), "AdamW: parameter ", name, " does not require grad");
    // Moments in fp32 (fp64 for a float64 run's masters).
    const at::ScalarType mt = p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    m_.push_back(at::zeros_like(p, mt));
    v_.push_back(at::zeros_like(p, mt));
  }
}

double AdamW::lr_at(int64_t step) const {
  if (cfg_.warmup_steps > 0 && step < cfg_.warmup_steps)
    return cfg_.lr * double(step + 1) / double(cfg_.warmup_steps);
  if (cfg_.total_steps <= cfg_.warmup_steps) return cfg_.lr;
  const double progress = std::min(
      1.0, double(step - cfg_.warmup_steps) / double(cfg_.total_steps - cfg_.warmup_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return cfg_.lr * (cfg_.min_lr_ratio + (1.0 - cfg_.min_lr_ratio) * cosine);
}

AdamW::Stats AdamW::step() {
  at::NoGradGuard no_grad;
  double sq = 0;
  for (const auto& [name, p] : params_)
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  const double norm = std::sqrt(sq);
  const double scale =
      (cfg_.clip_norm > 0 && norm > cfg_.clip_norm) ? cfg_.clip_norm / (norm + 1e-6) : 1.0;
  const double lr = lr_at(t_);
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, double(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, double(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].second;
    if (!p.grad().defined()) continue;  // no gradient: untouched, like torch.optim.AdamW
    const at::Tensor g = p.grad().to(m_[i].scalar_type()) * scale;
    m_[i].mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
    v_[i].mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
    const at::Tensor update = (m_[i] / bc1) / ((v_[i] / bc2).sqrt() + cfg_.eps);
    if (cfg_.weight_decay != 0) p.mul_(1.0 - lr * cfg_.weight_decay);
    p.sub_(update.to(p.scalar_type()), lr);
  }
  return {norm, lr};
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].first, m_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].first, v_[i]);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, at::Tensor>& moments, int64_t steps_taken,
                       const std::string& label) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::pair<const char*, at::Tensor*> slots[] = {{"exp_avg.", &m_[i]},
                                                         {"exp_avg_sq.", &v_[i]}};
    for (const auto& [prefix, dst] : slots) {
      const std::string name = prefix + params_[i].first;
      auto it = moments.find(name);
      if (it == moments.end())
        throw std::runtime_error(label + ": missing optimizer tensor " + name);
      if (it->second.sizes() != dst->sizes())
        throw std::runtime_error(label + ": " + name + ": shape differs from the parameter's");
      dst->copy_(it->second);
    }
  }
  t_ = steps_taken;
}

void zero_grads(const DrafterWeights& w) {
  for (auto& [n, t] : named(w)) t.mutable_grad().reset();
}

void scale_grads(const DrafterWeights& w, double den) {
  if (den <= 0) return;
  at::NoGradGuard ng;
  for (auto& [n, t] : named(w))
    if (t.grad().defined()) t.mutable_grad().div_(den);
}

void write_params(const std::string& path, const DrafterWeights& w) {
  if (path.empty()) return;
  safetensors::NamedTensors t;
  for (auto& [n, p] : named(w)) t.emplace_back(n, p.detach());
  safetensors::write(path, t, {{"format", "dflash-drafter-params-v1"}});
}

}  // namespace dflash
