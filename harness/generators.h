// RapidCheck generators for whole step configurations, shared by the
// property tests (gradcheck now, parity later). Sizes stay tiny so that a
// float64 finite-difference check of a case takes well under a second.
#pragma once

#include <rapidcheck.h>

#include "core/config.h"

namespace dflash::harness {

// A valid float64 config: B, S, block size, max anchors, H, heads / kv
// heads / head dim, intermediate, vocab, target layers and taps, drafter
// layers, gamma, ce/kl weights, temperature, tied embeddings, seed.
rc::Gen<Config> gen_micro_config();

}  // namespace dflash::harness
