#include "dist/cluster.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/device.h"
#include "core/hash.h"

namespace dflash::dist {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (!end || *end)
    throw DistError(fmt::format("environment variable {}={} is not an integer", name, v));
  return x;
}

int64_t index_of(const std::vector<int64_t>& v, int64_t x) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == x) return int64_t(i);
  return -1;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

Env env_from_process() {
  Env e;
  e.world_size = env_int("WORLD_SIZE", 1);
  e.node_rank = env_int("GROUP_RANK", env_int("NODE_RANK", 0));  // torchrun sets GROUP_RANK
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", 0);
  const bool have_rank = std::getenv("RANK") != nullptr;
  const bool have_node = std::getenv("LOCAL_RANK") && e.local_world_size > 0 &&
                         (std::getenv("NODE_RANK") || std::getenv("GROUP_RANK"));
  e.present = std::getenv("WORLD_SIZE") && (have_rank || have_node);
  e.local_rank = env_int("LOCAL_RANK", have_rank ? env_int("RANK", 0) : 0);
  // RANK, when set, is the launcher's word (torchrun's elastic rendezvous
  // orders nodes by arrival); otherwise the node's position gives it.
  e.rank = have_rank ? env_int("RANK", 0) : e.node_rank * e.local_world_size + e.local_rank;
  if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
  e.port = int(env_int("MASTER_PORT", 29500));
  return e;
}

std::string local_address_towards(const std::string& master_addr) {
  // A connected UDP socket sends nothing; getsockname gives the source
  // address the kernel picked for the route to the master.
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &res) != 0 || !res)
    throw DistError(fmt::format("MASTER_ADDR={}: cannot resolve it", master_addr));
  const int s = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = s >= 0 && connect(s, res->ai_addr, res->ai_addrlen) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  freeaddrinfo(res);
  if (s >= 0) close(s);
  if (!ok)
    throw DistError(fmt::format("MASTER_ADDR={}: no route to it from this host", master_addr));
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

uint64_t config_hash(const Config& c) {
  nlohmann::json j = config_to_json(c);
  j["run"].erase("threads");  // a per-machine setting, not part of the run
  return fnv1a64(j.dump());
}

Cluster::Cluster(const Config& c, const Env& env)
    : cfg_(c),
      env_(env),
      timeout_(std::chrono::milliseconds(int64_t(c.topology.timeout_s * 1000))) {
  const auto& tp = c.topology;
  if (env.world_size != tp.world_size)
    throw DistError(
        fmt::format("{}: topology.world_size is {} but the launcher started {} ranks "
                    "(WORLD_SIZE)",
                    c.path, tp.world_size, env.world_size));
  if (env.rank < 0 || env.rank >= env.world_size)
    throw DistError(fmt::format("RANK={} is outside [0, WORLD_SIZE={})", env.rank, env.world_size));
  target_index_ = index_of(tp.target_ranks, env.rank);
  drafter_index_ = index_of(tp.drafter_ranks, env.rank);

  c10d::TCPStoreOptions opts;
  opts.port = uint16_t(env.port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = size_t(env.world_size);
  // Rendezvous and the config comparison wait for the slowest rank to load
  // its target and data; steps and collectives then use timeout_s.
  const auto startup = std::chrono::milliseconds(int64_t(tp.startup_timeout_s * 1000));
  opts.timeout = startup;
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    throw DistError(fmt::format("rank {}: rendezvous at {}:{} failed within {} s: {}", env.rank,
                                env.master_addr, env.port, tp.startup_timeout_s, e.what()));
  }
  check_config(c);
  make_groups(c);
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

c10::intrusive_ptr<c10d::Backend> nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size,
                                               std::chrono::milliseconds timeout) {
  using Make = c10d::Backend* (*)(c10d::Store*, int, int, int64_t, char*, size_t);
  static Make make = [] {
    char exe[4096] = {0};
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    std::string dir = n > 0 ? std::string(exe, size_t(n)) : std::string(".");
    dir = dir.substr(0, dir.find_last_of('/'));
    const std::string lib = dir + "/libdflash_nccl.so";
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h) throw DistError(fmt::format("cannot load {}: {}", lib, dlerror()));
    auto* f = reinterpret_cast<Make>(dlsym(h, "dflash_nccl_backend"));
    if (!f) throw DistError(fmt::format("{} has no dflash_nccl_backend", lib));
    return f;
  }();
  char error[1024] = {0};
  c10d::Backend* b = make(store.get(), rank, size, timeout.count(), error, sizeof(error));
  if (!b) throw DistError(fmt::format("ProcessGroupNCCL: {}", error));
  return c10::intrusive_ptr<c10d::Backend>::reclaim(b);
}

// Every rank publishes "host/device"; NCCL needs each rank on its own device.
bool Cluster::ranks_have_own_devices(const c10::Device& d) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string mine = fmt::format("{}/{}", host, d.index());
  store_->set(fmt::format("device/{}", env_.rank), bytes_of(mine));
  std::set<std::string> seen;
  for (int64_t r = 0; r < env_.world_size; ++r) {
    const std::string key = fmt::format("device/{}", r);
    store_->wait({key}, std::chrono::milliseconds(int64_t(cfg_.topology.startup_timeout_s * 1000)));
    if (!seen.insert(string_of(store_->get(key))).second) return false;
  }
  return true;
}

// gloo over host memory, or NCCL when the run is on CUDA and every rank has
// a device of its own (DFLASH_DIST_BACKEND=gloo|nccl forces one).
void Cluster::make_groups(const Config& c) {
  const c10::Device dev = config_device(c);
  const char* forced = std::getenv("DFLASH_DIST_BACKEND");
  const std::string want = forced ? forced : "auto";
  if (want != "auto" && want != "gloo" && want != "nccl")
    throw DistError(fmt::format("DFLASH_DIST_BACKEND={}: expected gloo or nccl", want));
  bool nccl = dev.is_cuda() && want != "gloo" && ranks_have_own_devices(dev);
  if (want == "nccl" && !nccl)
    throw DistError(
        fmt::format("rank {}: DFLASH_DIST_BACKEND=nccl needs topology.device = cuda "
                    "and a device of its own for every rank",
                    env_.rank));
  if (nccl) {
    try {
      world_ = nccl_backend(c10::make_intrusive<c10d::PrefixStore>("world", store_), int(env_.rank),
                            int(env_.world_size), timeout_);
      if (is_drafter())
        drafters_ = nccl_backend(c10::make_intrusive<c10d::PrefixStore>("drafters", store_),
                                 int(drafter_index_), int(num_drafters()), timeout_);
      backend_ = "nccl", transport_ = dev;
      return;
    } catch (const DistError& e) {
      if (want == "nccl") throw;
      // Every rank meets the same failure (the same build): all fall back.
      fmt::print(stderr, "rank {}: NCCL unavailable ({}); using gloo through host memory\n",
                 env_.rank, e.what());
      world_.reset(), drafters_.reset();
    }
  }
  auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  options->devices.push_back(ifname && *ifname
                                 ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                 : c10d::ProcessGroupGloo::createDeviceForHostname(
                                       local_address_towards(env_.master_addr)));
  world_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo-world", store_), int(env_.rank),
      int(env_.world_size), options);
  if (is_drafter())
    drafters_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo-drafters", store_), int(drafter_index_),
        int(num_drafters()), options);
}

Cluster::~Cluster() {
  try {
    wait_sends(0, "flushing the last transfers");
  } catch (...) {
  }
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  if (backend_ == "nccl") {  // NCCL wants its communicators shut down, not just dropped
    try {
      if (drafters_) drafters_->shutdown();
      world_->shutdown();
    } catch (...) {
    }
  }
}

void Cluster::check_config(const Config& c) {
  try {
    compare_config_hashes(c);
  } catch (const DistError&) {
    throw;
  } catch (const std::exception& e) {  // rank 0 (the store) left, having found a difference
    throw DistError(
        fmt::format("rank {}: the rendezvous store went away while the ranks compared "
                    "configs (rank 0 ended; see its message): {}",
                    env_.rank, e.what()));
  }
}

void Cluster::compare_config_hashes(const Config& c) {
  // Every rank publishes its hash; every rank compares all of them.
  const uint64_t mine = config_hash(c);
  store_->set(fmt::format("config_hash/{}", env_.rank), bytes_of(std::to_string(mine)));
  for (int64_t r = 0; r < env_.world_size; ++r) {
    const std::string key = fmt::format("config_hash/{}", r);
    try {
      store_->wait({key},
                   std::chrono::milliseconds(int64_t(cfg_.topology.startup_timeout_s * 1000)));
    } catch (const std::exception& e) {
      throw DistError(
          fmt::format("rank {}: rank {} never published its config within {} s "
                      "(topology.startup_timeout_s)",
                      env_.rank, r, cfg_.topology.startup_timeout_s));
    }
    const std::string theirs = string_of(store_->get(key));
    if (theirs != std::to_string(mine))
      throw DistError(
          fmt::format("rank {}: the resolved config differs on rank {} (hash {} vs {} "
                      "here): every rank must run the same config",
                      env_.rank, r, theirs, mine));
  }
}

void Cluster::heartbeat_loop() {
  int64_t beat = 0;
  while (!stop_) {
    try {
      store_->set(fmt::format("alive/{}", env_.rank), bytes_of(std::to_string(++beat)));
    } catch (...) {
      return;  // the store is gone (rank 0 ended): nothing left to report to
    }
    for (int i = 0; i < 10 && !stop_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string Cluster::silent_ranks() const {
  // Two samples of every heartbeat, 1.5 s apart: whoever did not move is silent.
  try {
    std::vector<std::string> before;
    for (int64_t r = 0; r < env_.world_size; ++r)
      before.push_back(store_->check({fmt::format("alive/{}", r)})
                           ? string_of(store_->get(fmt::format("alive/{}", r)))
                           : "");
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::string silent;
    for (int64_t r = 0; r < env_.world_size; ++r) {
      if (r == env_.rank) continue;
      const std::string key = fmt::format("alive/{}", r);
      const std::string now = store_->check({key}) ? string_of(store_->get(key)) : "";
      if (now == before[size_t(r)]) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
    }
    return silent.empty() ? "no rank (every heartbeat still moves)" : "rank " + silent;
  } catch (...) {
    return "rank 0 (the rendezvous store is gone)";
  }
}

void Cluster::fail(const std::string& what, const std::exception& e) const {
  std::string msg = e.what();
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) msg = ce->what_without_backtrace();
  if (msg.size() > 300) msg = msg.substr(0, 300) + "...";
  throw DistError(fmt::format("rank {}: {} failed: {} [timeout {} s; heartbeats: silent: {}]",
                              env_.rank, what, msg, cfg_.topology.timeout_s, silent_ranks()));
}

namespace {

// The tensors where the backend needs them: gloo moves host memory (device
// tensors travel through host copies), NCCL the rank's device (host tensors,
// such as the step's sums, travel through device copies).
std::vector<at::Tensor> on(const std::vector<at::Tensor>& t, const c10::Device& where) {
  std::vector<at::Tensor> h;
  for (const at::Tensor& x : t) h.push_back(x.device() == where ? x : x.to(where));
  return h;
}
void copy_back(std::vector<at::Tensor>& t, const std::vector<at::Tensor>& h) {
  for (size_t i = 0; i < t.size(); ++i)
    if (!t[i].is_same(h[i])) t[i].copy_(h[i]);
}

}  // namespace

void Cluster::blocking(std::vector<at::Tensor>& io, bool copy_result, const std::string& what,
                       const Op& op) {
  std::vector<at::Tensor> t = on(io, transport_);
  try {
    op(t)->wait(timeout_);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (copy_result) copy_back(io, t);
}

void Cluster::send(std::vector<at::Tensor>& t_in, int64_t dst, int tag, const std::string& what) {
  blocking(t_in, false, fmt::format("{} (send to rank {})", what, dst),
           [&](std::vector<at::Tensor>& t) { return world_->send(t, int(dst), tag); });
}

void Cluster::isend(std::vector<at::Tensor> tensors, int64_t dst, int tag, size_t max_in_flight,
                    const std::string& what) {
  wait_sends(max_in_flight > 0 ? max_in_flight - 1 : 0, what);
  tensors = on(tensors, transport_);  // kept alive until the send completes
  try {
    in_flight_.push_back({world_->send(tensors, int(dst), tag), tensors, dst});
  } catch (const std::exception& e) {
    fail(fmt::format("{} (send to rank {})", what, dst), e);
  }
}

void Cluster::wait_sends(size_t max_in_flight, const std::string& what) {
  while (in_flight_.size() > max_in_flight) {
    InFlight& f = in_flight_.front();
    try {
      f.work->wait(timeout_);
    } catch (const std::exception& e) {
      fail(fmt::format("{} (send to rank {})", what, f.dst), e);
    }
    in_flight_.erase(in_flight_.begin());
  }
}

void Cluster::recv(std::vector<at::Tensor>& t_out, int64_t src, int tag, const std::string& what) {
  blocking(t_out, true, fmt::format("{} (receive from rank {})", what, src),
           [&](std::vector<at::Tensor>& t) { return world_->recv(t, int(src), tag); });
}

void Cluster::allreduce_drafters(std::vector<at::Tensor>& t_io, const std::string& what) {
  blocking(t_io, true, what + " (all-reduce over the drafter ranks)",
           [&](std::vector<at::Tensor>& t) { return drafters_->allreduce(t); });
}

void Cluster::broadcast_drafters(std::vector<at::Tensor>& t_io, const std::string& what) {
  blocking(t_io, true, what + " (broadcast from the first drafter rank)",
           [&](std::vector<at::Tensor>& t) {
             c10d::BroadcastOptions o;
             o.rootRank = 0;
             return drafters_->broadcast(t, o);
           });
}

void Cluster::announce_stop(int sig) {
  try {
    store_->set("split/stop", bytes_of(std::to_string(sig)));
  } catch (const std::exception& e) {
    fail("announcing the stop (rendezvous store)", e);
  }
}

int Cluster::stop_announced() {
  try {
    return store_->check({"split/stop"}) ? std::stoi(string_of(store_->get("split/stop"))) : 0;
  } catch (const std::exception& e) {
    fail("checking for a stop (rendezvous store)", e);
  }
}

void Cluster::publish_sent(int64_t g, bool done) {
  try {
    store_->set(fmt::format("split/sent/{}", target_index_),
                bytes_of(fmt::format("{} {}", g, done ? 1 : 0)));
  } catch (const std::exception& e) {
    fail("publishing the micro-batches sent (rendezvous store)", e);
  }
}

std::pair<int64_t, bool> Cluster::sent_by(int64_t target_index) {
  const std::string key = fmt::format("split/sent/{}", target_index);
  try {
    if (!store_->check({key})) return {-1, false};
    long long g = -1;
    int done = 0;
    std::sscanf(string_of(store_->get(key)).c_str(), "%lld %d", &g, &done);
    return {int64_t(g), done != 0};
  } catch (const std::exception& e) {
    fail(fmt::format("reading what target rank {} sent (rendezvous store)",
                     target_rank(target_index)),
         e);
  }
}

void Cluster::barrier_world(const std::string& what) {
  try {
    world_->barrier()->wait(timeout_);
  } catch (const std::exception& e) {
    fail(what + " (barrier)", e);
  }
}

}  // namespace dflash::dist
