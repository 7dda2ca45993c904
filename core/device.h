// The device a run computes on, and moving a run's tensors there. Written
// against ATen's device-generic API only: no CUDA symbol is linked, and on a
// CPU config none of this loads libtorch_cuda.
//   "cpu"     the host.
//   "cuda"    cuda:LOCAL_RANK under a launcher (torchrun or dflash launch sets
//             LOCAL_RANK), else cuda:0.
//   "cuda:N"  that device.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "core/step.h"

namespace dflash {

// `name` as a device ("cpu", "cuda", "cuda:N"), always with an index for
// CUDA ("cuda" = cuda:LOCAL_RANK, else cuda:0); `what` names the source in
// the error (a config key or a command-line flag).
c10::Device parse_device(const std::string& name, const std::string& what);

// The config's topology.device resolved for this process (LOCAL_RANK for
// "cuda").
c10::Device config_device(const Config& c);

// Why no CUDA device can be used here ("" when one can): loads libtorch_cuda
// (load_torch_cuda) and asks torch how many devices it sees. The gpu tests
// skip with this reason.
std::string cuda_unavailable();

// Makes `d` usable in this process: for CUDA, loads libtorch_cuda
// (load_torch_cuda), checks that torch sees the device and makes it the
// current one. Errors name `what`. A no-op for the CPU.
void activate_device(const c10::Device& d, const std::string& what);

// Every tensor moved to `d`; trainable leaves stay leaves that require grad.
void to_device(DrafterWeights& w, const c10::Device& d);
void to_device(TargetWeights& w, const c10::Device& d);
void to_device(FrozenWeights& w, const c10::Device& d);
StepInputs to_device(const StepInputs& in, const c10::Device& d);

// Waits for the device's queued work (timing); a no-op for the CPU.
void synchronize(const c10::Device& d);

}  // namespace dflash
