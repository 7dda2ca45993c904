#include "harness/on_device.h"

#include <utility>

#include "core/device.h"

namespace dflash::harness {
namespace {

// A differentiable copy (at::Tensor::to records ToCopyBackward).
at::Tensor there(const at::Tensor& t, const c10::Device& d) { return t.defined() ? t.to(d) : t; }
at::Tensor back(const at::Tensor& t) { return t.defined() ? t.to(at::kCPU) : t; }

StepOutputs outputs_back(const StepOutputs& o) {
  StepOutputs h = o;
  for (at::Tensor* t :
       {&h.loss, &h.ce, &h.kl, &h.ce_sum, &h.kl_sum, &h.reverse_kl, &h.reverse_kl_sum, &h.jsd,
        &h.jsd_sum, &h.tv, &h.tv_sum, &h.weight_sum, &h.correct, &h.counted, &h.accept_sum,
        &h.kept_blocks, &h.student_hidden})
    *t = back(*t);
  return h;
}

DrafterWeights weights_there(const DrafterWeights& w, const c10::Device& d) {
  DrafterWeights x = w;  // shares the tensors; each entry is replaced by its copy
  visit(x, [&](const std::string&, at::Tensor& t) { t = there(t, d); });
  return x;
}

Anchors anchors_there(const Anchors& a, const c10::Device& d) {
  return {there(a.anchors, d), there(a.keep, d)};
}

DraftLayout layout_there(const DraftLayout& l, const c10::Device& d) {
  DraftLayout x = l;
  for (at::Tensor* t :
       {&x.noise_ids, &x.positions, &x.labels, &x.teacher_index, &x.counted, &x.weights})
    *t = there(*t, d);
  return x;
}

// The config as the candidate sees it: on `d`, where the host kernels do not
// run (their ATen twin does).
Config on(const Config& c, const c10::Device& d) {
  Config x = c;
  x.topology.device = d.str();
  if (x.optimized.kernels == "host") x.optimized.kernels = "aten";
  return x;
}

}  // namespace

StepFn on_device(StepFn step, const c10::Device& device) {
  if (device.is_cpu()) return step;
  return [step = std::move(step), device](const Config& c, const DrafterWeights& w,
                                          const FrozenWeights& f, const StepInputs& in) {
    const Config cd = on(c, device);
    // Weights by differentiable copies (an audit still sees a frozen weight
    // that gets a gradient); the inputs carry none: core's to_device moves them.
    FrozenWeights fd{there(f.embed_tokens, device), there(f.lm_head, device)};
    return outputs_back(step(cd, weights_there(w, device), fd, to_device(in, device)));
  };
}

LossFn on_device(LossFn loss, const c10::Device& device) {
  if (device.is_cpu()) return loss;
  return [loss = std::move(loss), device](const Config& c, const at::Tensor& D,
                                          const at::Tensor& Ht, const at::Tensor& W,
                                          const DraftLayout& l, const Anchors& a) {
    const Config cd = on(c, device);
    return outputs_back(loss(cd, there(D, device), there(Ht, device), there(W, device),
                             layout_there(l, device), anchors_there(a, device)));
  };
}

AttentionFn on_device(AttentionFn attention, const c10::Device& device) {
  if (device.is_cpu()) return attention;
  return [attention = std::move(attention), device](
             const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Anchors& a,
             int64_t S, int64_t bs, int64_t tile, optimized::Kernels kernels) {
    // The host kernels do not run on a device: the ATen twin does.
    return back(attention(there(q, device), there(k, device), there(v, device),
                          anchors_there(a, device), S, bs, tile, optimized::Kernels::kAten));
  };
}

}  // namespace dflash::harness
