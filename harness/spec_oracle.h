// The SPEC oracle: a third implementation of one drafter step, written
// straight from docs/SPEC.md in plain loops over doubles. It shares
// nothing with core/ and reference/ but the Config struct: not the layout
// (noise ids, positions, mask, labels, weights, teacher rows), not RMSNorm,
// RoPE, attention, the MLP, the fc projection or the loss. Its gradients are
// central differences of its own loss. Meant for tiny configs (vocabulary,
// hidden size and sequence length in the tens): a mistake in the code both
// builds share makes the two builds agree with each other and disagree with
// this (harness/spec_oracle_test.cpp).
//
// Deliberately left out: anchor sampling (its seeded RNG stream is the
// reference's; the oracle checks the anchors it is given against SPEC's
// candidate rule instead), dtypes other than float64, the optimizer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"

namespace dflash::harness {

// Row-major arrays with the shapes of SPEC.md's step inputs.
struct OracleInputs {
  int64_t B = 0, S = 0, N = 0;
  std::vector<int64_t> input_ids;     // (B, S)
  std::vector<uint8_t> loss_mask;     // (B, S)
  std::vector<double> features;       // (B, S, L*H)
  std::vector<double> target_hidden;  // (B, S, H)
  std::vector<int64_t> anchors;       // (B, N)
  std::vector<uint8_t> keep;          // (B, N)
};

// Parameters by their SPEC.md names, each row-major as stored
// ((out, in) for linear weights), plus the frozen embed_tokens.weight and
// lm_head.weight (V, H).
using OracleParams = std::map<std::string, std::vector<double>>;

struct OracleResult {
  double loss = 0, ce = 0, kl = 0, weight_sum = 0, tau = 1;
  double reverse_kl = 0, jsd = 0, tv = 0;  // 0 when their weight is 0
  std::vector<double> weights;             // (B, Q) the loss weights used (D-PACE's included)
  std::vector<int64_t> correct, counted;  // (bs) per slot
  std::vector<double> student_hidden;     // (B, Q, H)
  std::string anchor_violation;           // "" when the anchors obey SPEC step 2
};

// One step (forward, loss, metrics).
OracleResult oracle_step(const Config& c, const OracleInputs& in, const OracleParams& p);

// d loss / d p[name][index] by a central difference of the oracle's loss
// (step rel_step relative to the entry's scale; error ~1e-10 relative at
// 1e-5). TV's |p_s - p_t| has a kink: a step that crosses it averages the
// two sides, and a smaller step tells (harness/oracle_property.cpp).
double oracle_gradient(const Config& c, const OracleInputs& in, OracleParams p,
                       const std::string& name, size_t index, double rel_step = 1e-5);

}  // namespace dflash::harness
