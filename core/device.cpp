#include "core/device.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <cstdlib>

#include "core/env.h"

namespace dflash {

c10::Device parse_device(const std::string& name, const std::string& what) {
  if (!is_device_name(name))
    throw std::runtime_error(
        fmt::format("{}: expected \"cpu\", \"cuda\" or \"cuda:N\", found \"{}\"", what, name));
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "cuda") {  // this process's device: a launched rank's LOCAL_RANK, else 0
    const char* local = std::getenv("LOCAL_RANK");
    return c10::Device(c10::kCUDA, c10::DeviceIndex(local && *local ? std::atoi(local) : 0));
  }
  return c10::Device(c10::kCUDA, c10::DeviceIndex(std::stoi(name.substr(5))));
}

c10::Device config_device(const Config& c) {
  return parse_device(c.topology.device, c.path + ": topology.device");
}

std::string cuda_unavailable() {
  std::string why;
  if (!load_torch_cuda(&why)) return "this libtorch cannot run CUDA: " + why;
  if (at::detail::getCUDAHooks().deviceCount() == 0)
    return "no CUDA device is visible (driver missing, or CUDA_VISIBLE_DEVICES empty)";
  return "";
}

void activate_device(const c10::Device& d, const std::string& what) {
  if (d.is_cpu()) return;
  TORCH_CHECK(d.is_cuda() && d.has_index(), what, ": unsupported device ", d.str());
  if (const std::string why = cuda_unavailable(); !why.empty())
    throw std::runtime_error(
        fmt::format("{} = \"{}\": {}; `dflash env` says why", what, d.str(), why));
  const int count = at::detail::getCUDAHooks().deviceCount();
  if (d.index() >= count)
    throw std::runtime_error(fmt::format("{} = \"{}\": this machine has {} CUDA device{}", what,
                                         d.str(), count, count == 1 ? "" : "s"));
  c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(d);
}

namespace {

void move(at::Tensor& t, const c10::Device& d) {
  if (!t.defined() || t.device() == d) return;
  const bool grad = t.requires_grad();
  t = t.detach().to(d);
  if (grad) t.requires_grad_(true);
}

}  // namespace

void to_device(DrafterWeights& w, const c10::Device& d) {
  visit(w, [&](const std::string&, at::Tensor& t) { move(t, d); });
}

void to_device(TargetWeights& w, const c10::Device& d) {
  // Tied heads stay one tensor on the device.
  const bool tied = w.lm_head.defined() && w.lm_head.is_same(w.embed_tokens);
  visit(w, [&](const std::string&, at::Tensor& t) { move(t, d); });
  if (tied) w.lm_head = w.embed_tokens;
}

void to_device(FrozenWeights& w, const c10::Device& d) {
  const bool tied = w.lm_head.defined() && w.lm_head.is_same(w.embed_tokens);
  move(w.embed_tokens, d);
  if (tied)
    w.lm_head = w.embed_tokens;
  else
    move(w.lm_head, d);
}

StepInputs to_device(const StepInputs& in, const c10::Device& d) {
  StepInputs out = in;
  for (at::Tensor* t : {&out.input_ids, &out.loss_mask, &out.features, &out.target_hidden,
                        &out.anchors.anchors, &out.anchors.keep})
    move(*t, d);
  return out;
}

void synchronize(const c10::Device& d) {
  if (d.is_cpu()) return;
  c10::impl::VirtualGuardImpl(d.type()).synchronizeDevice(d.has_index() ? d.index() : 0);
}

}  // namespace dflash
