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

std::string gb(double bytes) {
  return bytes >= 1e8 ? fmt::format("{:.2f} GB", bytes / 1e9)
                      : fmt::format("{:.1f} MB", bytes / 1e6);
}

// This process's share of the plan: one local rank for a step, the target
// rank's items for features, every rank of the run for training.
struct Need {
  double bytes = 0;
  std::string what;
};

Need need_of(const Config& c, Workload w) {
  if (w == Workload::kFeatures) {
    std::string largest;
    const double peak = peak_of(target_items(c, /*dense_attention=*/true), 1, &largest);
    return {peak, "the target forward, largest item " + largest};
  }
  PlanVariant v = configured_variant(c);
  if (w == Workload::kReferenceStep)
    v.name = "reference", v.loss = LossMode::kUnchunked, v.dense_attention = true,
    v.checkpoint = false;
  Config local = c;
  if (w != Workload::kTrain) local.topology = TopologyConfig{};
  const Plan p = plan_memory(local, v, /*dense_target_attention=*/true);
  const bool one_host = c.topology.device == "cpu";
  Need n;
  const RankPlan* worst = &p.ranks.front();
  for (const RankPlan& r : p.ranks) {
    if (r.peak > worst->peak) worst = &r;
    n.bytes = one_host ? n.bytes + r.peak : std::max(n.bytes, r.peak);
  }
  n.what = p.ranks.size() == 1 ? fmt::format("{} plan, largest item {}", v.name, worst->largest)
                               : fmt::format("{} {} ranks, {} plan; largest item {} on rank {}",
                                             one_host ? "all" : "the largest of", p.ranks.size(),
                                             v.name, worst->largest, worst->rank);
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

MemoryBudget memory_budget(const Config& c, Workload w, double capacity) {
  const Need n = need_of(c, w);
  const double reserve = c.topology.memory_reserve_gb * 1e9;
  MemoryBudget b;
  b.need = n.bytes;
  b.have = std::max(0.0, capacity - reserve);
  b.fits = b.need <= b.have;
  b.text =
      fmt::format("needs an estimated {} ({}); offered {} ({} minus topology.memory_reserve_gb {})",
                  gb(b.need), n.what, gb(b.have), gb(capacity), gb(reserve));
  return b;
}

void set_ignore_memory_plan(bool ignore) { g_ignore_memory_plan = ignore; }

void guard_memory(const Config& c, Workload w, const std::string& command) {
  // A CUDA run is held to the configured device size; a CPU run (all its
  // ranks on this host) to the memory this host has available now.
  const bool cuda = c.topology.device != "cpu";             // "cuda" or "cuda:N"
  if (cuda && c.topology.device_memory_gb.empty()) return;  // the environment check sizes it
  const double capacity = cuda ? *std::min_element(c.topology.device_memory_gb.begin(),
                                                   c.topology.device_memory_gb.end()) *
                                     1e9
                               : available_host_bytes();
  const MemoryBudget b = memory_budget(c, w, capacity);
  if (b.fits) return;
  const std::string msg = fmt::format(
      "{}: {}: does not fit: {} {}.\nShrink the config (`dflash plan --config {}` breaks the "
      "estimate down), or pass --ignore-memory-plan to allocate anyway.",
      command, c.path, b.text,
      cuda ? "(device, topology.device_memory_gb)" : "(this host, MemAvailable)", c.path);
  if (!g_ignore_memory_plan) throw std::runtime_error(msg);
  std::fprintf(stderr, "warning (--ignore-memory-plan): %s\n", msg.c_str());
}

}  // namespace dflash::harness
