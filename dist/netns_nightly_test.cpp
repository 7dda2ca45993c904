// The split over two hosts (nightly): two network namespaces on this
// machine joined by a veth pair (root and iproute2's `ip netns`), one
// `dflash launch --nnodes 2` per namespace, gloo over the veth addresses.
// Rank 0 serves the rendezvous on host A (10.77.0.1); host B's ranks reach
// it over the pair, and every gloo device binds to its own host's address
// (dist/cluster.h). Parity: the two-host split ends with the parameters and
// losses of one process with --micro-batches 2. Fault: host B dies (every
// process in its namespace killed); host A's ranks end within the timeout
// naming the silent ranks. Skipped with the reason without root or `ip`.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "dist/split_test_support.h"
#include "fixtures/test_support.h"

namespace dflash {
namespace {

using namespace testing_support;

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces)";
    if (sh("ip netns list").code != 0) GTEST_SKIP() << "no `ip netns` (iproute2)";
    const std::string id = std::to_string(getpid() % 100000);
    a_ = "dflash-a-" + id, b_ = "dflash-b-" + id;
    const std::string va = "dfa" + id, vb = "dfb" + id;
    const Shell made =
        sh("set -e; ip netns add " + a_ + "; ip netns add " + b_ + "; ip link add " + va +
           " type veth peer name " + vb + "; ip link set " + va + " netns " + a_ +
           "; ip link set " + vb + " netns " + b_ + "; ip -n " + a_ +
           " addr add 10.77.0.1/24 dev " + va + "; ip -n " + b_ + " addr add 10.77.0.2/24 dev " +
           vb + "; for n in " + a_ + " " + b_ + "; do ip -n $n link set lo up; done; ip -n " + a_ +
           " link set " + va + " up; ip -n " + b_ + " link set " + vb + " up");
    ASSERT_EQ(made.code, 0) << made.out;
  }
  void TearDown() override {
    if (a_.empty()) return;
    sh("ip netns pids " + b_ + " | xargs -r kill -9; ip netns pids " + a_ +
       " | xargs -r kill -9; ip netns del " + a_ + "; ip netns del " + b_);
  }
  // One node's launcher in its namespace, in the background; output to log.
  std::string node(const std::string& ns, int node_rank, const std::string& args,
                   const std::string& log) const {
    return "ip netns exec " + ns + " " + dflash() + " launch --nproc 2 --nnodes 2 --node-rank " +
           std::to_string(node_rank) + " --master-addr 10.77.0.1 --master-port 29617 -- " + args +
           " > " + log + " 2>&1";
  }
  std::string a_, b_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(TwoHosts, SplitOverTwoHostsEqualsOneProcess) {
  TmpDir tmp;
  const std::string train = "train --skip-preflight --config " + cfg("dist-2x2.toml") +
                            " --steps 2 --out-dir " + (tmp / "run") + " --out-params " +
                            (tmp / "split.st");
  const Shell both =
      sh("(" + node(b_, 1, train, tmp / "b.log") + ") & " + node(a_, 0, train, tmp / "a.log") +
         "; a=$?; wait $!; b=$?; " + "echo codes $a $b; [ $a -eq 0 ] && [ $b -eq 0 ]");
  ASSERT_EQ(both.code, 0) << both.out << "\nhost A:\n"
                          << slurp(tmp / "a.log") << "\nhost B:\n"
                          << slurp(tmp / "b.log");
  const Shell single = sh(dflash() + " train --skip-preflight --config " + cfg("dist-2x2.toml") +
                          " --steps 2 --micro-batches 2 --out-dir " + (tmp / "single") +
                          " --out-params " + (tmp / "single.st"));
  ASSERT_EQ(single.code, 0) << single.out;
  const harness::ComparisonReport rep = compare_params(tmp / "split.st", tmp / "single.st");
  EXPECT_TRUE(rep.ok()) << rep.format();
  const auto ls = losses(slurp(tmp / "a.log") + slurp(tmp / "b.log")), l1 = losses(single.out);
  ASSERT_EQ(ls.size(), l1.size()) << slurp(tmp / "a.log") << slurp(tmp / "b.log");
  for (size_t i = 0; i < ls.size(); ++i) EXPECT_NEAR(ls[i], l1[i], 1e-10 * (1 + std::abs(l1[i])));
}

TEST_F(TwoHosts, DeadHostIsNamedByTheOtherWithinTheTimeout) {
  TmpDir tmp;
  const std::string train = "train --skip-preflight --config " + cfg("dist-2x2.toml") +
                            " --steps 3000 --out-dir " + (tmp / "run");
  // Host B dies (every process in its namespace, SIGKILL) once step 2 is
  // logged; host A must end by itself within timeout_s (20 s) plus the grace.
  const Shell a =
      sh("(" + node(b_, 1, train, tmp / "b.log") + ") & " +
         "(for i in $(seq 600); do grep -Eq 'step +2 ' " + (tmp / "b.log") + " " + (tmp / "a.log") +
         " 2>/dev/null && break; sleep 0.1; done; ip netns pids " + b_ + " | xargs -r kill -9) & " +
         "timeout 120 " + node(a_, 0, train, tmp / "a.log") + "; echo host A exit $?");
  const std::string out = slurp(tmp / "a.log");
  if (std::getenv("DFLASH_VERBOSE")) std::cout << out << a.out;
  EXPECT_NE(a.out.find("host A exit"), std::string::npos) << a.out;
  EXPECT_EQ(a.out.find("host A exit 0"), std::string::npos) << "host A did not notice: " << out;
  EXPECT_EQ(a.out.find("host A exit 124"), std::string::npos) << "host A hung: " << out;
  EXPECT_NE(out.find("silent"), std::string::npos) << out;
  EXPECT_TRUE(out.find("rank 2") != std::string::npos || out.find("rank 3") != std::string::npos)
      << "the silent ranks of host B are not named: " << out;
}

}  // namespace
}  // namespace dflash
