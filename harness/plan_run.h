// `dflash plan`: the memory planner's verdicts for a config.
#pragma once

#include <string>

namespace dflash {
struct Config;
}  // namespace dflash

namespace dflash::harness {
// Prints SPEC.md's single-tensor figures at the config's sizes, then the
// configured plan with its per-rank breakdown and each fallback's verdict.
// Exit 0 when the configured plan fits.
int run_plan(const Config& c, bool all_ranks, const std::string& json);
}  // namespace dflash::harness
