// Preflight's environment check: does the machine described by `env` (this
// one, from `dflash env`, or another machine's `dflash env --json`) offer
// what the config's [topology] asks for: the device kind, a device per
// local rank, and at least topology.device_memory_gb on each.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/env.h"

namespace dflash::harness {

struct EnvVerdict {
  bool ok = true;
  std::string figure;  // one line for the verdict table
  std::string detail;  // what failed and what to do, when !ok
};

// `local_world_size`: ranks on this node (torchrun's LOCAL_WORLD_SIZE);
// 0 = not launched by torchrun, every rank of the topology runs here.
EnvVerdict check_environment(const Config& c, const Environment& env, int64_t local_world_size);

// LOCAL_WORLD_SIZE from the process environment, 0 when unset; throws on a
// value that is not a positive integer.
int64_t local_world_size_from_process();

}  // namespace dflash::harness
