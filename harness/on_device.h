// Candidates on a device, checked against references on the host: each
// wrapper moves its inputs to `device` with differentiable copies (so the
// gradients of the host leaves the harness compares flow back through them)
// and its outputs back to the CPU. The properties, the audit and the zoo then
// hold a CUDA candidate to the float64 CPU reference unchanged
// (`dflash parity --device`, the gpu-labelled tests). On the CPU they are the
// identity.
#pragma once

#include <c10/core/Device.h>

#include "harness/properties.h"

namespace dflash::harness {

StepFn on_device(StepFn step, const c10::Device& device);
LossFn on_device(LossFn loss, const c10::Device& device);
AttentionFn on_device(AttentionFn attention, const c10::Device& device);

}  // namespace dflash::harness
