// The target/drafter split over c10d (SPEC.md's 8-GPU layout): rendezvous
// from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) through a TCPStore, a gloo process group over all ranks for
// the target -> drafter transfers and a second one over the drafter ranks
// for gradient all-reduce. (NCCL groups are the GPU build's business: the
// transport here is written against c10d's ProcessGroup calls only.)
//
// Faults: every collective and transfer waits at most topology.timeout_s;
// each rank publishes a heartbeat in the store, so a rank whose operation
// times out can name the rank that stopped (died or hung).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/step.h"

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace dflash::dist {

struct DistError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The launcher's environment; present = a rank and WORLD_SIZE were set.
// One node: RANK (LOCAL_RANK defaults to it). Several nodes (torchrun
// --nnodes, dflash launch --nnodes): RANK, or, when a launcher sets none,
// GROUP_RANK (torchrun) or NODE_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK. Rank 0 serves the rendezvous
// store at MASTER_ADDR:MASTER_PORT; every rank binds its gloo device to GLOO_SOCKET_IFNAME if set,
// else to its own address on the route to MASTER_ADDR.
struct Env {
  bool present = false;
  int64_t rank = 0, world_size = 1, local_rank = 0;
  int64_t node_rank = 0, local_world_size = 0;  // 0: not given (one node)
  std::string master_addr = "127.0.0.1";
  int port = 29500;
};
Env env_from_process();

// This host's address on the route to `master_addr` (what a gloo device
// binds to); "127.0.0.1" for a loopback master.
std::string local_address_towards(const std::string& master_addr);

// c10d's ProcessGroupNCCL from libdflash_nccl.so beside the dflash binary
// (dlopened on first use; dist/nccl_plugin.cpp); throws DistError naming
// the library and the loader's or NCCL's reason. Needs libtorch_cuda loaded.
c10::intrusive_ptr<c10d::Backend> nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size,
                                               std::chrono::milliseconds timeout);

// A stable hash of the resolved config (what every rank must agree on).
uint64_t config_hash(const Config& c);

class Cluster {
 public:
  // Rendezvous, topology checks against the launcher's world size, the
  // config-hash comparison, the process groups and the heartbeat.
  Cluster(const Config& c, const Env& env);
  ~Cluster();

  int64_t rank() const { return env_.rank; }
  int64_t world_size() const { return env_.world_size; }
  bool is_target() const { return target_index_ >= 0; }
  bool is_drafter() const { return drafter_index_ >= 0; }
  int64_t target_index() const { return target_index_; }
  int64_t drafter_index() const { return drafter_index_; }
  int64_t num_targets() const { return int64_t(cfg_.topology.target_ranks.size()); }
  int64_t num_drafters() const { return int64_t(cfg_.topology.drafter_ranks.size()); }
  int64_t target_rank(int64_t i) const { return cfg_.topology.target_ranks[size_t(i)]; }
  int64_t drafter_rank(int64_t i) const { return cfg_.topology.drafter_ranks[size_t(i)]; }

  // Point-to-point over the world group; `what` names the transfer in errors.
  void send(std::vector<at::Tensor>& tensors, int64_t dst, int tag, const std::string& what);
  void recv(std::vector<at::Tensor>& tensors, int64_t src, int tag, const std::string& what);
  // Asynchronous send: at most `max_in_flight` sends stay outstanding (the
  // target's bounded queue); the tensors are kept alive until they complete.
  void isend(std::vector<at::Tensor> tensors, int64_t dst, int tag, size_t max_in_flight,
             const std::string& what);
  void wait_sends(size_t max_in_flight, const std::string& what);
  // Sum over the drafter ranks, in place.
  void allreduce_drafters(std::vector<at::Tensor>& tensors, const std::string& what);
  void broadcast_drafters(std::vector<at::Tensor>& tensors, const std::string& what);
  void barrier_world(const std::string& what);

  // Stopping the split on a signal (docs/DISTRIBUTED.md, "Stopping"), through
  // the rendezvous store: drafter rank 0 announces the agreed stop (the
  // signal); each target rank publishes the last micro-batch it has posted
  // and, once it has seen the stop, that it posts no more ({-1, false}
  // before its first).
  void announce_stop(int sig);
  int stop_announced();  // the signal, 0 before any
  void publish_sent(int64_t g, bool done);
  std::pair<int64_t, bool> sent_by(int64_t target_index);

  // Rethrows a communication failure as a DistError naming the silent rank.
  [[noreturn]] void fail(const std::string& what, const std::exception& e) const;

  // "gloo" (host memory; device tensors are staged through it) or "nccl"
  // (every rank of a CUDA run on a device of its own; dist/nccl_plugin.cpp).
  const std::string& backend() const { return backend_; }

 private:
  void check_config(const Config& c);
  void compare_config_hashes(const Config& c);
  void heartbeat_loop();
  std::string silent_ranks() const;
  // The shape every blocking transfer shares: the tensors staged where the
  // backend wants them, `op` started on them and waited for (the cluster's
  // timeout), a failure named by `what`, and, with `copy_result`, the
  // result copied back into the caller's tensors (receive, all-reduce,
  // broadcast).
  using Op = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>;
  void blocking(std::vector<at::Tensor>& io, bool copy_result, const std::string& what,
                const Op& op);

  Config cfg_;
  Env env_;
  int64_t target_index_ = -1, drafter_index_ = -1;
  c10::intrusive_ptr<c10d::Store> store_;
  void make_groups(const Config& c);
  bool ranks_have_own_devices(const c10::Device& d);

  c10::intrusive_ptr<c10d::Backend> world_, drafters_;
  std::string backend_ = "gloo";
  c10::Device transport_{c10::kCPU};  // where tensors must be for the backend
  std::chrono::milliseconds timeout_;
  struct InFlight {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> tensors;
    int64_t dst;
  };
  std::vector<InFlight> in_flight_;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

}  // namespace dflash::dist
