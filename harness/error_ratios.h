// The tolerance measurement (`dflash parity --measure-tolerances`): runs the
// step, loss and attention properties on the real code and tabulates, per
// property, dtype and tensor kind, the distribution of the error ratio
// err / err(same-precision reference) and of the floor each comparison
// needed: (err - k * err_same) / scale, the relative floor below which the
// correct code would have failed. docs/HARNESS.md sets the bounds from it.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::harness {

// The table as text (and JSON into *json when not null).
std::string measure_error_ratios(int cases, uint64_t seed, std::string* json = nullptr);
// The same per objective and weighting of docs/LOSSES.md (each fixed in turn),
// float32 and bfloat16, random and near-agreement loss cases
// (`dflash parity --measure-tolerances --per-objective`).
std::string measure_objective_error_ratios(int cases, uint64_t seed,
                                           std::string* json = nullptr);

}  // namespace dflash::harness
