// The memory guard: every command that builds model-sized tensors asks the
// planner what it is about to allocate and compares that with what this
// machine (or the configured device) offers, before allocating anything.
// A config the machine cannot hold stops with the figures, not with an OOM
// kill minutes later (issue 14). `--ignore-memory-plan` overrides it.
#pragma once

#include <string>

#include "core/config.h"
#include "harness/planner.h"  // Workload, Where, estimate_memory

namespace dflash::harness {

struct MemoryBudget {
  bool fits = true;
  double need = 0;   // bytes, the planner's estimate for this process (or this host)
  double have = 0;   // bytes the machine or device offers, reserve subtracted
  std::string text;  // the figures, one line each; says what overrides
};

// Bytes this host can give now: MemAvailable of /proc/meminfo (physical
// memory where that cannot be read).
double available_host_bytes();

// The estimate for `w` (estimate_memory, counted for `where`) against
// `capacity` bytes (the host's or a device's). For a run on one host (cpu)
// the need is the sum of its ranks; on devices, the largest rank. Pure: no
// allocation proportional to the config.
MemoryBudget memory_budget(const Config& c, Workload w, const Where& where, double capacity);

// Throws std::runtime_error with memory_budget's text when the config does
// not fit (after set_ignore_memory_plan(true) it prints a warning to stderr
// instead). `command` names the command in the message ("dflash step").
// Counted for where_it_runs(c): the configured CUDA device (held to
// topology.device_memory_gb; unchecked when that is empty) or this host.
void guard_memory(const Config& c, Workload w, const std::string& command);

// `--ignore-memory-plan` on the command line (process-wide, set by cli/main).
void set_ignore_memory_plan(bool ignore);

}  // namespace dflash::harness
