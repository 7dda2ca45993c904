// Each objective and weighting of docs/LOSSES.md trains the default run
// through the command line (nightly: five shortened runs; two of them side by
// side under ctest -j2 slowed each other to ~10 minutes, so they stay out of
// the quick suite).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures/test_support.h"

namespace dflash::train {
namespace {

using testing_support::dflash;
using testing_support::sh;
using testing_support::Shell;
using testing_support::TmpDir;

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Each objective and weighting of docs/LOSSES.md trains the default run,
// set from the command line (--set; docs/CONFIG.md), shortened to 40 steps
// on 64 samples: its term is on, falls, held-out tau rises, and the run's
// config.toml records the override.
struct ObjectiveRun {
  const char* name;
  std::vector<std::string> set;
  const char* term;      // the metrics.jsonl field of the objective's term
  const char* recorded;  // a line of the run's config.toml
};

void PrintTo(const ObjectiveRun& o, std::ostream* os) { *os << o.name; }

class DefaultRunObjectives : public ::testing::TestWithParam<ObjectiveRun> {};

TEST_P(DefaultRunObjectives, TrainsThroughTheCommandLine) {
  if (!std::filesystem::exists("/usr/share/common-licenses/Apache-2.0"))
    GTEST_SKIP() << "the default run's text, /usr/share/common-licenses, is missing";
  const ObjectiveRun& o = GetParam();
  TmpDir tmp;
  std::string cmd = dflash() + " train --skip-preflight --config " +
                    testing_support::cfg("tiny-train.toml") + " --out-dir " + (tmp / "run");
  for (const char* kv :
       {"train.steps=40", "data.num_samples=64", "data.eval_samples=16", "train.eval_every=40",
        "train.eval_batches=2", "train.served_eval_every=0", "train.checkpoint_every=40"})
    cmd += std::string(" --set ") + kv;
  for (const std::string& kv : o.set) cmd += " --set '" + kv + "'";
  const Shell r = sh(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("held-out tau ([0-9.]+) -> ([0-9.]+)")))
      << r.out;
  EXPECT_GT(std::stod(m[2]), std::stod(m[1]) + 0.2) << r.out;
  std::vector<double> term;  // per logged train step
  std::istringstream lines(slurp(tmp / "run/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["kind"] == "train") term.push_back(j[o.term].get<double>());
  }
  ASSERT_GE(term.size(), 2u);
  EXPECT_GT(term.front(), 0.0) << o.term;
  // TV starts near its bound 1 where the two distributions barely overlap,
  // and falls slowest.
  EXPECT_LT(term.back(), 0.9 * term.front()) << o.term << " does not fall";
  EXPECT_NE(slurp(tmp / "run/config.toml").find(o.recorded), std::string::npos) << o.recorded;
}

INSTANTIATE_TEST_SUITE_P(
    Objectives, DefaultRunObjectives,
    ::testing::Values(ObjectiveRun{"reverse_kl",
                                   {"loss.kl_weight=0", "loss.reverse_kl_weight=0.5"},
                                   "reverse_kl",
                                   "reverse_kl_weight = 0.5"},
                      ObjectiveRun{"jsd",
                                   {"loss.kl_weight=0", "loss.jsd_weight=1", "loss.jsd_beta=0.5"},
                                   "jsd",
                                   "jsd_weight = 1.0"},
                      ObjectiveRun{
                          "tv", {"loss.kl_weight=0", "loss.tv_weight=1"}, "tv", "tv_weight = 1.0"},
                      ObjectiveRun{"dpace",
                                   {"loss.weighting=dpace", "loss.gamma=0", "loss.dpace_alpha=0.5"},
                                   "kl",
                                   "weighting = \"dpace\""},
                      ObjectiveRun{"uniform",
                                   {"loss.weighting=uniform", "loss.gamma=0"},
                                   "kl",
                                   "weighting = \"uniform\""}),
    [](const ::testing::TestParamInfo<ObjectiveRun>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace dflash::train
