// `dflash launch --nproc N -- <subcommand ...>`: N local ranks with
// torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT; with --nnodes also NODE_RANK and LOCAL_WORLD_SIZE, one
// launcher per node), their output forwarded line by line with a rank prefix. When
// one rank fails, the others are stopped (SIGTERM marked kEndRankNow, then
// SIGKILL after a grace period) and the launcher returns the failing rank's
// exit code. SIGTERM / SIGINT to the launcher is forwarded to every rank
// (each in a process group of its own) as a stop request; when they stop in
// order the launcher exits 128 + signal with the `--resume` command.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "core/signals.h"
#include "harness/preflight.h"
#include "train/loop.h"

namespace dflash::cli {
namespace {

int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("launch: cannot find a free TCP port on loopback");
  const int port = ntohs(a.sin_port);
  close(s);
  return port;
}

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of the child's stdout + stderr
  std::string pending;
  bool running = true;
  int code = 0;
};

struct Placement {
  int64_t nproc, nnodes, node_rank;
  std::string master_addr;
  int port;
  int64_t rank(int64_t local) const { return node_rank * nproc + local; }
};

Child spawn(int64_t local, const Placement& p, const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("launch: pipe failed");
  Child c;
  c.pid = fork();
  if (c.pid < 0) throw std::runtime_error("launch: fork failed");
  if (c.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
    // A group of its own: a terminal's Ctrl-C reaches the launcher only, which
    // forwards it once (two would reach a rank otherwise).
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    setenv("RANK", std::to_string(p.rank(local)).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(p.nproc * p.nnodes).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(p.nproc).c_str(), 1);
    setenv("NODE_RANK", std::to_string(p.node_rank).c_str(), 1);
    if (!p.master_addr.empty())
      setenv("MASTER_ADDR", p.master_addr.c_str(), 1);
    else if (!std::getenv("MASTER_ADDR"))
      setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(p.port).c_str(), 1);
    if (!std::getenv("OMP_NUM_THREADS")) {  // share the cores instead of oversubscribing them
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      setenv("OMP_NUM_THREADS", std::to_string(std::max<int64_t>(1, cores / p.nproc)).c_str(), 1);
    }
    std::vector<char*> argv;
    std::string self = "dflash";
    argv.push_back(self.data());
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    std::perror("launch: exec");
    std::_Exit(127);
  }
  setpgid(c.pid, c.pid);  // also here: no window where a signal to our group reaches it
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  c.out = fds[0];
  return c;
}

// Forwards whatever the child has written, one prefixed line at a time.
void forward(Child& c, int64_t rank, bool flush_all) {
  char buf[4096];
  ssize_t n;
  while (c.out >= 0 && (n = read(c.out, buf, sizeof(buf))) > 0) c.pending.append(buf, size_t(n));
  size_t nl;
  while ((nl = c.pending.find('\n')) != std::string::npos) {
    fmt::print("[rank {}] {}\n", rank, c.pending.substr(0, nl));
    c.pending.erase(0, nl + 1);
  }
  if (flush_all && !c.pending.empty())
    fmt::print("[rank {}] {}\n", rank, c.pending), c.pending.clear();
  std::fflush(stdout);
}

// Ends the running ranks after one failed: SIGCONT (a stopped rank), then
// SIGTERM queued with kEndRankNow, which a rank's stop handler does not take
// for a stop request (train/loop.h); SIGKILL follows after the grace.
void end_ranks(std::vector<Child>& kids) {
  sigval v{};
  v.sival_int = kEndRankNow;
  for (auto& o : kids)
    if (o.running) kill(o.pid, SIGCONT), sigqueue(o.pid, SIGTERM, v);
}

// The command that continues a stopped `launch -- train` run.
std::string resume_command(const LaunchArgs& a) {
  std::string cmd = fmt::format("dflash launch --nproc {}", a.nproc);
  if (a.nnodes > 1)
    cmd +=
        fmt::format(" --nnodes {} --node-rank {} (one launcher per node)", a.nnodes, a.node_rank);
  cmd += " --";
  bool resume = false;
  for (const auto& x : a.args) cmd += " " + x, resume |= x == "--resume";
  return resume ? cmd : cmd + " --resume";
}

// A forwarded SIGTERM / SIGINT has ended every rank in order.
int report_stop(const LaunchArgs& a, int sig) {
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (a.args[0] != "train") {
    fmt::print(stderr, "dflash launch: stopped by {}; every rank has ended\n", name);
    return 128 + sig;
  }
  fmt::print(stderr,
             "dflash launch: stopped by {}; every rank stopped after the same step and drafter "
             "rank 0's checkpoint is complete (named above).\n"
             "Continue the run with the same command and --resume:\n  {}\n",
             name, resume_command(a));
  std::fflush(stderr);
  return 128 + sig;
}

}  // namespace

// `launch -- train --config C` runs preflight once, here, before any rank
// starts (unless the ranks were told --skip-preflight), and tells the ranks.
std::string launch_verdict;  // the verdict file this launcher wrote, removed at the end

int preflight_before_training(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "train") return 0;
  std::string config, device;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--skip-preflight") return 0;
    if (args[i] == "--config" && i + 1 < args.size()) config = args[i + 1];
    if (args[i].rfind("--config=", 0) == 0) config = args[i].substr(9);
    if (args[i] == "--device" && i + 1 < args.size()) device = args[i + 1];
    if (args[i].rfind("--device=", 0) == 0) device = args[i].substr(9);
  }
  if (config.empty()) return 0;  // the ranks will report the missing --config
  harness::PreflightOptions o;
  o.config = config;
  o.device = device;
  o.cases = 25;
  o.json = "/tmp/dflash-launch-preflight-" + std::to_string(::getpid()) + ".json";
  // In a child process: a CUDA preflight's context and cached blocks must
  // not stay on rank 0's device for the whole run.
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("launch: fork failed");
  if (pid == 0) {
    int code = 1;
    try {
      code = harness::run_preflight(o);
    } catch (const std::exception& e) {
      fmt::print(stderr, "dflash launch: preflight: {}\n", e.what());
    }
    std::fflush(stdout);
    std::_Exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fmt::print(stderr,
               "dflash launch: preflight FAILED; no rank started (--skip-preflight "
               "after `train` overrides, knowingly)\n");
    return 1;
  }
  setenv("DFLASH_PREFLIGHT_PASSED", o.json.c_str(), 1);  // the verdict, for the run directory
  launch_verdict = o.json;
  return 0;
}

namespace {

struct Outcome {
  int64_t failed_rank = -1;
  int failed_code = 0;
  int forwarded = 0;     // the signal forwarded to the ranks, 0 if none came
  bool stopped = false;  // a rank exited 128 + that signal: it stopped in order
};

// Forwards the ranks' output until every rank has ended. A signal received
// here goes to every rank once; a rank that exits 128 + that signal stopped
// in order. Any other failure (a non-zero exit, a rank killed by a signal)
// ends the others (end_ranks; SIGKILL after `grace_s`).
Outcome supervise(std::vector<Child>& kids, const Placement& place, double grace_s) {
  Outcome out;
  auto deadline = std::chrono::steady_clock::time_point::max();
  for (;;) {
    std::vector<pollfd> fds;
    for (auto& k : kids) fds.push_back({k.out, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    if (const int sig = stop_requested(); sig != 0 && out.forwarded == 0) {
      out.forwarded = sig;
      fmt::print("dflash launch: {} received; asking every rank to stop\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM");
      for (auto& k : kids)
        if (k.running) kill(k.pid, sig);
    }
    int running = 0;
    for (size_t r = 0; r < kids.size(); ++r) {
      Child& k = kids[r];
      forward(k, place.rank(int64_t(r)), false);
      if (!k.running) continue;
      int status = 0;
      if (waitpid(k.pid, &status, WNOHANG) != k.pid) {
        ++running;
        continue;
      }
      k.running = false;
      k.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      forward(k, place.rank(int64_t(r)), true);
      const bool in_order =
          out.forwarded != 0 && WIFEXITED(status) && k.code == 128 + out.forwarded;
      out.stopped |= in_order;
      if (k.code == 0 || in_order || out.failed_rank >= 0) continue;
      out.failed_rank = place.rank(int64_t(r)), out.failed_code = k.code;
      fmt::print("dflash launch: rank {} exited with code {}; stopping the other ranks\n",
                 out.failed_rank, k.code);
      end_ranks(kids);
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(grace_s));
    }
    if (running == 0) return out;
    if (std::chrono::steady_clock::now() > deadline)
      for (auto& o : kids)
        if (o.running) kill(o.pid, SIGKILL);
  }
}

}  // namespace

int cmd_launch(const LaunchArgs& a) {
  if (a.nproc < 1) throw std::runtime_error("launch: --nproc must be >= 1");
  if (a.args.empty())
    throw std::runtime_error(
        "launch: nothing to run (dflash launch --nproc N -- <subcommand ...>)");
  if (a.nnodes < 1 || a.node_rank < 0 || a.node_rank >= a.nnodes)
    throw std::runtime_error(
        fmt::format("launch: --node-rank {} is outside [0, --nnodes {})", a.node_rank, a.nnodes));
  const char* env_port = std::getenv("MASTER_PORT");
  const char* env_addr = std::getenv("MASTER_ADDR");
  Placement place{a.nproc, a.nnodes, a.node_rank, a.master_addr,
                  a.master_port > 0 ? a.master_port
                  : env_port        ? std::atoi(env_port)
                                    : 0};
  if (a.nnodes > 1 && (place.port == 0 || (place.master_addr.empty() && !env_addr)))
    throw std::runtime_error(
        "launch: several nodes need the rendezvous named: --master-addr (node 0's address) and "
        "--master-port (or MASTER_ADDR / MASTER_PORT), the same on every node");
  if (place.port == 0) place.port = free_port();
  if (const int gate = preflight_before_training(a.args); gate != 0) return gate;
  // SIGTERM / SIGINT here (a scheduler, a terminal): forwarded once to every
  // rank as a stop request; a second one ends the launcher, and the ranks
  // with it (PR_SET_PDEATHSIG).
  install_stop_handlers();
  std::vector<Child> kids;
  for (int64_t r = 0; r < a.nproc; ++r) kids.push_back(spawn(r, place, a.args));
  const Outcome out = supervise(kids, place, a.grace_s);
  for (auto& k : kids) close(k.out);
  if (!launch_verdict.empty()) std::remove(launch_verdict.c_str());  // our verdict copy only
  if (out.failed_rank >= 0) return out.failed_code;
  if (out.stopped) return report_stop(a, out.forwarded);
  return 0;
}

}  // namespace dflash::cli
