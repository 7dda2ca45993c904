#include "harness/plan_run.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "harness/planner.h"

namespace dflash::harness {

namespace {

// The estimates preflight and the memory guard print (one memory story):
// the run as planned, per rank on the configured devices; then what dflash's
// own commands allocate, counted where this process would run them.
nlohmann::json print_estimates(const Config& c, bool all_ranks) {
  fmt::print("\nmemory estimates (the figures preflight and the memory guard print):\n");
  nlohmann::json out = nlohmann::json::array();
  const std::pair<Workload, Where> rows[] = {
      {Workload::kPlannedRun, configured_where(c)},
      {Workload::kTrain, where_it_runs(c)},
      {Workload::kStep, where_it_runs(c)},
      {Workload::kReferenceStep, where_it_runs(c)},
  };
  for (const auto& [w, where] : rows) {
    std::string last;
    for (const Estimate& e : estimate_memory(c, w, where)) {
      nlohmann::json parts = nlohmann::json::object();
      for (const EstimatePart& p : e.parts) parts[p.label] = p.bytes;
      out.push_back({{"workload", e.workload},
                     {"who", e.who},
                     {"where", e.where},
                     {"bytes", e.peak},
                     {"moment", e.moment},
                     {"parts", parts},
                     {"line", e.line()}});
      // Ranks of one role with the same figure print once unless --all-ranks.
      const std::string key = e.who.substr(e.who.find('(')) + fmt::format("{}", e.peak);
      if (all_ranks || key != last) fmt::print("  {}\n", e.line());
      last = key;
    }
  }
  return out;
}

}  // namespace

int run_plan(const Config& c, bool all_ranks, const std::string& json) {
  const std::string& path = c.path;
  fmt::print(
      "dflash plan {}: {} ranks ({} target, {} drafter) on {}, {:.1f} GB each{}, reserve {} GB\n\n",
      path, c.topology.world_size, c.topology.target_ranks.size(), c.topology.drafter_ranks.size(),
      c.topology.device,
      c.topology.device_memory_gb.empty() ? machine_memory_bytes() / 1e9
                                          : c.topology.device_memory_gb[0],
      c.topology.device_memory_gb.empty() ? " (this host's memory)" : "",
      c.topology.memory_reserve_gb);
  nlohmann::json j = {
      {"config", path}, {"figures", nlohmann::json::array()}, {"plans", nlohmann::json::array()}};
  fmt::print("single tensors (SPEC.md figures):\n");
  for (const Figure& f : spec_figures(c)) {
    fmt::print("  {:<44} {:>9.2f} GB  ({:.1f} GiB)  {}\n", f.name, f.bytes / 1e9,
               f.bytes / (1 << 30) * 1.0, f.formula);
    j["figures"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"formula", f.formula}});
  }
  j["estimates"] = print_estimates(c, all_ranks);
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
