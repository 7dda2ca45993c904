// The memory guard (harness/memory_guard.h): the planner's estimate of what a
// command is about to allocate, held against what this host or the
// configured device offers.
#include "harness/memory_guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "harness/planner.h"

namespace dflash::harness {
namespace {

bool g_ignore_memory_plan = false;

// What the process (or, for a run on one host, all its ranks) needs: the
// estimate's labelled line, or the sum of the ranks' lines.
struct Need {
  double bytes = 0;
  std::string what;
};

Need need_of(const Config& c, Workload w, const Where& where) {
  const std::vector<Estimate> es = estimate_memory(c, w, where);
  if (es.size() == 1) return {es[0].peak, es[0].line()};
  const bool one_host = where.device == "cpu";
  Need n;
  const Estimate* worst = &es.front();
  for (const Estimate& r : es) {
    if (r.peak > worst->peak) worst = &r;
    n.bytes = one_host ? n.bytes + r.peak : std::max(n.bytes, r.peak);
  }
  if (!one_host)
    return {n.bytes, fmt::format("the largest of {} ranks, {}", es.size(), worst->line())};
  n.what = fmt::format("{:.2f} GB, the sum of {} ranks on this host", n.bytes / 1e9, es.size());
  for (const Estimate& r : es) n.what += "; " + r.line();
  return n;
}

}  // namespace

double available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return machine_memory_bytes();
}

MemoryBudget memory_budget(const Config& c, Workload w, const Where& where, double capacity) {
  const Need n = need_of(c, w, where);
  const double reserve = c.topology.memory_reserve_gb * 1e9;
  MemoryBudget b;
  b.need = n.bytes;
  b.have = std::max(0.0, capacity - reserve);
  b.fits = b.need <= b.have;
  b.text = fmt::format("needs an estimated {}; offered {} ({} minus topology.memory_reserve_gb {})",
                       n.what, human_bytes(b.have), human_bytes(capacity), human_bytes(reserve));
  return b;
}

void set_ignore_memory_plan(bool ignore) { g_ignore_memory_plan = ignore; }

void guard_memory(const Config& c, Workload w, const std::string& command) {
  // A CUDA run is held to the configured device size; a CPU run (all its
  // ranks on this host), or a CUDA config on a host without a usable CUDA
  // device, to the memory this host has available now.
  const Where where = where_it_runs(c);
  const bool cuda = where.device != "cpu";
  if (cuda && c.topology.device_memory_gb.empty()) return;  // the environment check sizes it
  const double capacity = cuda ? *std::min_element(c.topology.device_memory_gb.begin(),
                                                   c.topology.device_memory_gb.end()) *
                                     1e9
                               : available_host_bytes();
  const MemoryBudget b = memory_budget(c, w, where, capacity);
  if (b.fits) return;
  const std::string msg = fmt::format(
      "{}: {}: does not fit: {} {}.\nShrink the config (`dflash plan --config {}` breaks the "
      "estimate down), or pass --ignore-memory-plan to allocate anyway.",
      command, c.path, b.text,
      cuda ? "(the cuda device, topology.device_memory_gb)" : "(this host, MemAvailable)", c.path);
  if (!g_ignore_memory_plan) throw std::runtime_error(msg);
  std::fprintf(stderr, "warning (--ignore-memory-plan): %s\n", msg.c_str());
}

}  // namespace dflash::harness
