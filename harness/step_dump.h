// One step as a safetensors file (`dflash dump`), and back (`dflash step
// --from`): inputs, parameters (trainable and frozen) and config, plus the
// outputs and gradients that the step produced. A user can write such a file
// from their own PyTorch trainer and compare.
//
// Names: input.{input_ids, loss_mask, features, target_hidden, anchors, keep};
// every drafter parameter and embed_tokens.weight / lm_head.weight by their
// SPEC.md names; output.{loss, ce, kl, tau, accuracy, student_hidden};
// grad.<name> per trainable parameter; metadata "config" = resolved config JSON.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/step.h"

namespace dflash::harness {

struct StepDump {
  Config config;
  DrafterWeights drafter;  // float leaves in the config's dtype, requires_grad
  FrozenWeights frozen;
  StepInputs inputs;
  std::map<std::string, at::Tensor> recorded;  // output.* and grad.* found in the file
  std::vector<std::string> unknown;  // names that are none of input.*, a weight, output.*, grad.*
  std::string producer;              // __metadata__.producer ("dflash dump ..." for dflash's own)
  std::string path;
};

void write_step_dump(const std::string& path, const Config& c, const DrafterWeights& w,
                     const FrozenWeights& f, const StepInputs& in, const StepResult& r);

// Validates names, dtypes and shapes against the embedded config; every
// problem is an error naming the file and the tensor.
StepDump read_step_dump(const std::string& path);

// output.* tensors of a step, as written to a dump.
NamedTensors output_tensors(const StepOutputs& o);

// The metadata value `producer` of dflash's own dumps; a dump whose producer
// starts with it is compared bit for bit by default.
extern const char* const kDflashProducer;

}  // namespace dflash::harness
