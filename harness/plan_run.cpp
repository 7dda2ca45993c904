#include "harness/plan_run.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "harness/planner.h"

namespace dflash::harness {

int run_plan(const std::string& path, bool all_ranks, const std::string& json) {
  const Config c = load_config(path);
  fmt::print("dflash plan {}: {} ranks ({} target, {} drafter), {} GB each, reserve {} GB\n\n",
             path, c.topology.world_size, c.topology.target_ranks.size(),
             c.topology.drafter_ranks.size(),
             c.topology.device_memory_gb.empty() ? machine_memory_bytes() / 1e9
                                                 : c.topology.device_memory_gb[0],
             c.topology.memory_reserve_gb);
  nlohmann::json j = {
      {"config", path}, {"figures", nlohmann::json::array()}, {"plans", nlohmann::json::array()}};
  fmt::print("single tensors (SPEC.md figures):\n");
  for (const Figure& f : spec_figures(c)) {
    fmt::print("  {:<44} {:>9.2f} GB  ({:.1f} GiB)  {}\n", f.name, f.bytes / 1e9,
               f.bytes / (1 << 30) * 1.0, f.formula);
    j["figures"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"formula", f.formula}});
  }
  bool configured_fits = false;
  for (const PlanVariant& v : standard_variants(c)) {
    const Plan p = plan_memory(c, v);
    if (v.name == "configured") configured_fits = p.fits();
    fmt::print("\n{}", p.format(v.name == "configured" || all_ranks));
    nlohmann::json pj = {
        {"variant", v.name}, {"fits", p.fits()}, {"ranks", nlohmann::json::array()}};
    for (const auto& r : p.ranks) {
      nlohmann::json rj = {{"rank", r.rank},
                           {"role", r.role},
                           {"peak_bytes", r.peak},
                           {"capacity_bytes", r.capacity},
                           {"headroom_bytes", r.headroom},
                           {"fits", r.fits},
                           {"largest", r.largest},
                           {"items", nlohmann::json::array()}};
      for (const auto& i : r.items)
        rj["items"].push_back({{"name", i.name}, {"bytes", i.bytes}, {"formula", i.formula}});
      pj["ranks"].push_back(rj);
    }
    j["plans"].push_back(pj);
  }
  fmt::print("\nverdict: the configured run {}\n",
             configured_fits ? "fits" : "does NOT fit (OOM predicted)");
  if (!json.empty()) safetensors::write_file_atomic(json, j.dump(2) + "\n");
  return configured_fits ? 0 : 1;
}

}  // namespace dflash::harness
