// `dflash preflight --config C`: the verdict before a run.
//   (a) validate the config, and check that the machine offers what its
//       [topology] asks for (device kind, a device per local rank, memory;
//       harness/env_check.h) -- this machine, or another one's description;
//   (b) plan memory at full scale, failing on a predicted OOM (breakdown);
//   (c) build a scaled-down twin with the config's structure and run the
//       parity property on it (fresh seeds, batches and anchors per case),
//       the requires_grad audit on it, and the components' memory ceilings;
//   (d) run one real optimized step of the full config when this machine
//       can hold it (the planner decides), checking loss and gradients are
//       finite;
//   (e) print a verdict table and exit 0 only when every check passes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace dflash::harness {

struct PreflightOptions {
  std::string config;
  std::vector<std::string> set;  // --set KEY=VALUE overrides of the config
  std::string json;
  int cases = 100;  // per parity property
  uint64_t seed = 1;
  // Test hook: replace the optimized step's components with a bug-zoo mutant.
  std::string mutant;
  // The machine to check the topology against: "" = this one (probed), else
  // a description written by `dflash env --json` on that machine.
  std::string env_file;
  // Skip the environment check (planning for a machine that is not here).
  bool plan_for_another_machine = false;
  // Where a failing twin-parity case is written (counterexample-twin-parity.toml,
  // replayable with `dflash parity --reproduce`).
  std::string out_dir = ".";
  // Overrides the config's topology.device ("" = as configured).
  std::string device;
};

int run_preflight(const PreflightOptions& o);

// The scaled-down twin: same switches, block size, anchor rule, dtype, loss
// settings and chunk-to-Q ratio; tiny dimensions; a fixture target; one rank.
Config scaled_twin(const Config& c);

}  // namespace dflash::harness
