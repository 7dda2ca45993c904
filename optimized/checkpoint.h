// Activation checkpointing for libtorch (which has no checkpoint API), with an
// explicit requires_grad contract.
//
// checkpoint() runs `fn` without building a graph and keeps only its inputs.
// In backward it restores the CPU generator's state of the first run (a GPU
// build would also need the CUDA generator's), re-runs `fn` with grad enabled
// and differentiates it. The caller names what must receive
// gradients; a violation is a loud error naming the region and the tensor,
// never PyTorch's silent "gradients will be None":
//   - a named grad input that does not require grad, or (for an activation)
//     that is a leaf cut from the graph, throws at the call;
//   - a named parameter that does not require grad, or an input declared
//     non-differentiable that does, throws at the call;
//   - in backward, a named parameter that gets no gradient, or a trainable
//     tensor the region uses without naming it, throws.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace dflash::optimized {

struct Named {
  std::string name;
  at::Tensor tensor;
  // For grad inputs: true if the input is an activation that must carry its
  // graph (a leaf here means someone detached it). Leaves requiring grad are
  // accepted when false.
  bool activation = true;
};

struct CheckpointContract {
  std::string region;              // e.g. "layers.1", for messages
  std::vector<Named> grad_inputs;  // differentiable inputs: must receive gradients
  std::vector<Named> inputs;       // other tensor inputs: never differentiated
  std::vector<Named> params;       // parameters the region uses: must receive gradients
};

// fn(grad_inputs, inputs) -> one output. fn may use the contract's params
// (captured), but no other tensor that requires grad.
using CheckpointFn = std::function<at::Tensor(const std::vector<at::Tensor>& grad_inputs,
                                              const std::vector<at::Tensor>& inputs)>;

at::Tensor checkpoint(const CheckpointContract& contract, const CheckpointFn& fn);

}  // namespace dflash::optimized
