// What this machine offers a run (`dflash env`, and preflight's first check
// after the config): the libtorch it was built against, CUDA runtime, driver
// and devices, cores and host memory. The same description is written and
// read as JSON (`dflash env --json F`), so preflight can check a config
// against another machine's description (`--env F`) and tests can describe
// machines that are not here.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/cuda_probe.h"

namespace dflash {

struct Environment {
  std::string source = "this machine";  // or the JSON file it was read from
  // libtorch
  std::string torch_version;       // e.g. "2.11.0"
  bool torch_cuda = false;         // libtorch_cuda is loaded (CUDA kernels registered)
  std::string torch_cuda_version;  // CUDA version libtorch was built for, e.g. "13.0"
  std::string cudnn_version;       // cuDNN libtorch was built with
  std::string nccl_version;        // NCCL libtorch loaded, "" = none
  bool gloo = false;               // c10d's gloo backend
  std::string blas;                // BLAS libtorch uses on the CPU
  // CUDA runtime, driver and devices (core/cuda_probe.h)
  CudaProbe cuda;
  // host
  int64_t cores = 0;
  int64_t host_memory_bytes = 0, host_available_bytes = 0;
};

// Loads libtorch_cuda (from libtorch_cpu's directory, RTLD_GLOBAL) once:
// its static initializers register the CUDA kernels, hooks and NCCL. dflash
// links no CUDA part of libtorch, so CPU commands never pay for it. False
// (with the reason in *why) for a CPU-only libtorch or a failed load.
bool load_torch_cuda(std::string* why = nullptr);

// Probes this machine (loading libtorch_cuda first); `run_kernel` also runs
// dflash's CUDA probe kernel on every device.
Environment probe_environment(bool run_kernel = true);

nlohmann::json environment_to_json(const Environment& e);
// Throws std::runtime_error naming `label` and the field on a malformed one.
Environment environment_from_json(const nlohmann::json& j, const std::string& label);
Environment load_environment(const std::string& path);

// The human-readable table of `dflash env`.
std::string format_environment(const Environment& e);

}  // namespace dflash
