// The `dflash` subcommands. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::cli {

struct StepArgs {
  std::string config;            // --config: run one fixture step
  std::string from;              // --from: recompute a dumped step
  uint64_t step = 0;             // --step: which fixture step (batch and anchors)
  int64_t threads = -1;          // --threads: overrides run.threads when >= 0
  bool check = false;            // --check: with --from, exit 1 unless every recorded tensor agrees
  std::string compare = "auto";  // --compare: auto | bitwise | tolerance (harness/dump_check.h)
  std::string build = "reference";  // --build: reference | optimized
  std::string device;               // --device: overrides topology.device
  std::vector<std::string> set;     // --set KEY=VALUE config overrides, in order
};
int cmd_step(const StepArgs& a);

struct DumpArgs {
  std::string config, out;
  std::vector<std::string> set;
  uint64_t step = 0;
  int64_t threads = -1;
  std::string init_from;  // the drafter of this directory instead of the seeded one
};
int cmd_dump(const DumpArgs& a);

struct ValidateArgs {
  std::string config;
  std::string print;  // "", "toml" or "json"
  std::vector<std::string> set;
};
int cmd_validate(const ValidateArgs& a);

struct BenchArgs {
  bool dist = false;  // --dist: the target/drafter split's transfers and collectives
  std::string dist_config = "fixtures/configs/dist-1x2.toml";
  std::vector<std::string> set;  // with --dist: overrides of dist_config
  std::vector<std::string> cases;
  bool quick = false;
  int repeats = 2;
  std::string json;
  int64_t threads = 0;
  std::string device = "cpu";    // --device: cpu, cuda, cuda:N
  std::string kernels = "auto";  // --kernels: auto, host, aten
};
int cmd_bench(const BenchArgs& a);

struct LaunchArgs {
  int64_t nproc = 1;        // ranks on this node
  int64_t nnodes = 1;       // nodes in the run (one launcher per node)
  int64_t node_rank = 0;    // this node: its ranks are node_rank * nproc + [0, nproc)
  std::string master_addr;  // several nodes: node 0's address (rank 0 serves the store)
  int master_port = 0;      // 0: $MASTER_PORT, else a free port (one node only)
  double grace_s = 5.0;     // SIGTERM -> SIGKILL
  std::vector<std::string> args;
};
int cmd_launch(const LaunchArgs& a);

// `dflash prepare ARGS...`: python -m dflash.prepare ARGS... (cli/prepare.cpp).
int cmd_prepare(const std::vector<std::string>& args);
// The torch environment's python (DFLASH_PYTHON overrides it) and this
// checkout's python/ directory, for the Python parts of the CLI.
std::string torch_python();
std::string python_dir();

struct InspectArgs {
  std::string file;
  std::string json;  // --json F ("-" = stdout)
};
// A safetensors file's tensors (dtype, shape, FNV-1a 64 of the bytes) and metadata.
int cmd_inspect(const InspectArgs& a);

struct EnvArgs {
  std::string json;        // --json F ("-" = stdout)
  bool no_kernel = false;  // --no-kernel: skip the per-device probe kernel
};
int cmd_env(const EnvArgs& a);

// "dflash 0.1.0 (libtorch 2.11.0, ...)": `dflash --version` (cli/version.cpp).
std::string version_text();

}  // namespace dflash::cli
