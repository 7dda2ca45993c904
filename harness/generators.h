// RapidCheck generators for whole step configurations, shared by the
// property tests, `dflash parity` and the bug zoo. Sizes stay tiny so that a
// case (three steps: float64 reference, same-precision reference, candidate)
// takes milliseconds.
#pragma once

#include <rapidcheck.h>

#include <ostream>

#include "core/config.h"

namespace dflash {
// RapidCheck prints (and `dflash parity` saves) a counterexample config as TOML.
void showValue(const Config& c, std::ostream& os);
}  // namespace dflash

namespace dflash::harness {

// A valid float64 config with a fixture batch: B, S, block size, max anchors,
// H, heads / kv heads / head dim, intermediate, vocab, target layers and taps,
// drafter layers, gamma, ce/kl weights, temperature, tied embeddings, seed.
rc::Gen<Config> gen_micro_config();

// Draws every objective weight, JSD's beta, the temperature and the
// weighting (with its gamma or alpha) into `loss`, inside rc::gen::exec.
void gen_objectives(LossConfig& loss);

// gen_micro_config plus everything parity varies: chunk size (0, 1,
// non-divisors, larger than Q), component switches and attention tile, dtype
// (float64, float32, bfloat16; bf16 cases use drafter head_dim 8 or 16), and an inline batch whose
// rows mix loss-mask holes, rows without any anchor candidate, full rows, and rows whose only
// candidates sit at 0 and S-2 (so those anchors are always drawn).
rc::Gen<Config> gen_step_config();

}  // namespace dflash::harness
