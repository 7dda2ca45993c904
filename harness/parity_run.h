// `dflash parity`: the parity properties, the audit, the memory ceilings and
// the bug zoo in one run, with a summary table, JSON and JUnit reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {
struct Config;
}  // namespace dflash

namespace dflash::harness {

struct ParityOptions {
  int cases = 200;
  uint64_t seed = 1;
  bool zoo = true;
  std::string config;            // also audit this config (built at its full size)
  std::vector<std::string> set;  // --set KEY=VALUE overrides of `config`
  std::string reproduce;         // replay one counterexample TOML instead of the suite
  std::string json, junit;
  std::string out_dir = ".";  // where failing counterexamples are written
  // Check a parity-checked zoo mutant instead of the real optimized step
  // (shows what a failure looks like; with --reproduce, replays against it).
  std::string mutant;
  // Instead of the suite: the error-ratio measurement (harness/error_ratios.h).
  bool measure_tolerances = false;
  bool per_objective = false;  // with measure_tolerances: the per-objective table
  // Where the candidate runs ("cpu", "cuda", "cuda:N"); the references stay
  // on the CPU in float64 (harness/on_device.h).
  std::string device = "cpu";
};

// Exit code: 0 when the real code passes every check and every mutant dies.
int run_parity(const ParityOptions& o);

// `dflash audit --config C --build B`: the per-parameter table of one step.
int run_audit(const Config& c, const std::string& build);
// `dflash audit --from FILE`: rules (a)-(c) on a dump's recorded gradients.
int run_audit_dump(const std::string& path);

}  // namespace dflash::harness
