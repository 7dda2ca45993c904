// Seeded initialisation of the target and drafter weights, and the anchors
// of a micro-batch: what a run starts from (docs/TRAINING.md) and what every
// test fixture builds on. Everything is a pure function of (config, seed,
// name or index), portable across platforms and libtorch versions.
//
// Init (documented, Hugging Face style): every matrix ~ N(0, init_std); every
// RMSNorm weight = 1 + norm_init_jitter * N(0, 1) (jitter 0 gives HF's ones;
// tests use a jitter so a swapped or skipped norm changes the result). Each
// tensor draws from its own stream Rng(derive_seed(run.seed, <its name>)), so
// adding a layer never changes the others. A tied target uses one tensor for
// embed_tokens and lm_head.
#pragma once

#include <ATen/ATen.h>

#include "core/batch.h"
#include "core/config.h"
#include "core/weights.h"

namespace dflash {

TargetWeights make_target(const Config& c);
// Trainable leaves (requires_grad) in master_type(run.dtype).
DrafterWeights make_drafter(const Config& c);

// The anchors of micro-batch `index` (SPEC step 2) from the named stream
// ("anchors" for training, "eval_anchors" for evaluation): every path that
// builds a micro-batch (fixtures, the training loop, the split's drafters)
// draws them here, so they agree.
Anchors step_anchors(const Config& c, const at::Tensor& loss_mask, const char* stream,
                     uint64_t index);

// One parameter of `spec`'s shape from its own stream: N(0, std), or
// 1 + jitter * N(0, 1) for a norm weight.
at::Tensor seeded_tensor(const ParamSpec& spec, uint64_t seed, double std, double jitter,
                         at::ScalarType dtype);

}  // namespace dflash
