#include "core/env.h"

#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <sched.h>
#include <torch/version.h>

#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/files.h"
#include "core/safetensors.h"

namespace dflash {
namespace {

std::string dotted(long v, long major_div, long minor_div, long minor_mod) {
  if (v <= 0) return "";
  return fmt::format("{}.{}", v / major_div, (v / minor_div) % minor_mod);
}

// NCCL is a dependency of libtorch_cuda: when that is loaded, so is NCCL,
// and its version function can be found without NCCL's headers.
std::string loaded_nccl_version() {
  using Fn = int (*)(int*);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  int v = 0;
  if (!fn || fn(&v) != 0 || v <= 0) return "";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::string blas_of(const std::string& config) {
  const auto at = config.find("BLAS_INFO=");
  if (at == std::string::npos) return "";
  const auto end = config.find_first_of(", \n", at);
  return config.substr(at + 10, end == std::string::npos ? end : end - at - 10);
}

// MemTotal and MemAvailable from /proc/meminfo, in bytes.
void host_memory(int64_t* total, int64_t* available) {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemTotal:") *total = kb * 1024;
    if (key == "MemAvailable:") *available = kb * 1024;
  }
}

int64_t usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int64_t(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

bool load_torch_cuda(std::string* why) {
  static std::string error;
  static const bool loaded = [] {
    void* cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
    char dir[PATH_MAX] = {0};
    if (!cpu || dlinfo(cpu, RTLD_DI_ORIGIN, dir) != 0) {
      error = "libtorch_cpu.so is not loaded";
      return false;
    }
    const std::string path = std::string(dir) + "/libtorch_cuda.so";
    if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      const char* e = dlerror();
      error = path + ": " + (e ? e : "cannot load");
      return false;
    }
    return true;
  }();
  if (why) *why = error;
  return loaded;
}

Environment probe_environment(bool run_kernel) {
  load_torch_cuda();
  Environment e;
  e.torch_version = TORCH_VERSION;
  const auto& hooks = at::detail::getCUDAHooks();
  e.torch_cuda = hooks.hasCUDART();
  if (e.torch_cuda) {
    e.torch_cuda_version = dotted(hooks.versionCUDART(), 1000, 10, 100);
    e.cudnn_version = hooks.versionCuDNN() > 0 ? dotted(hooks.versionCuDNN(), 10000, 100, 100) : "";
    e.nccl_version = loaded_nccl_version();
  }
#ifdef USE_C10D_GLOO
  e.gloo = true;
#endif
  e.blas = blas_of(at::show_config());
  e.cuda = probe_cuda(run_kernel);
  e.cores = usable_cores();
  host_memory(&e.host_memory_bytes, &e.host_available_bytes);
  return e;
}

nlohmann::json environment_to_json(const Environment& e) {
  nlohmann::json devices = nlohmann::json::array();
  for (const CudaDevice& d : e.cuda.devices)
    devices.push_back({{"index", d.index},
                       {"name", d.name},
                       {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
                       {"total_bytes", d.total_bytes},
                       {"free_bytes", d.free_bytes},
                       {"kernel_ran", d.kernel_ran},
                       {"kernel_error", d.kernel_error}});
  return {{"torch",
           {{"version", e.torch_version},
            {"cuda", e.torch_cuda},
            {"cuda_version", e.torch_cuda_version},
            {"cudnn_version", e.cudnn_version},
            {"nccl_version", e.nccl_version},
            {"gloo", e.gloo},
            {"blas", e.blas}}},
          {"cuda",
           {{"compiled", e.cuda.compiled},
            {"architectures", e.cuda.architectures},
            {"runtime_version", e.cuda.runtime_version},
            {"driver_version", e.cuda.driver_version},
            {"error", e.cuda.error},
            {"devices", devices}}},
          {"host",
           {{"cores", e.cores},
            {"memory_bytes", e.host_memory_bytes},
            {"available_bytes", e.host_available_bytes}}}};
}

namespace {

// Reads `key` of object `j` (at `where` in the file) as T; a missing key or a
// wrong type is an error naming the file and the field.
template <typename T>
T field(const nlohmann::json& j, const std::string& where, const char* key,
        const std::string& label) {
  const std::string name = where.empty() ? key : where + "." + key;
  if (!j.is_object() || !j.contains(key))
    throw std::runtime_error(fmt::format("{}: missing field {}", label, name));
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    throw std::runtime_error(
        fmt::format("{}: field {} has the wrong type ({})", label, name, j.at(key).dump()));
  }
}

CudaDevice device_from_json(const nlohmann::json& j, const std::string& where,
                            const std::string& label) {
  CudaDevice d;
  d.index = field<int>(j, where, "index", label);
  d.name = field<std::string>(j, where, "name", label);
  const std::string cc = field<std::string>(j, where, "compute_capability", label);
  if (std::sscanf(cc.c_str(), "%d.%d", &d.cc_major, &d.cc_minor) != 2)
    throw std::runtime_error(fmt::format(
        "{}: field {}.compute_capability is \"{}\", expected major.minor", label, where, cc));
  d.total_bytes = field<int64_t>(j, where, "total_bytes", label);
  d.free_bytes = field<int64_t>(j, where, "free_bytes", label);
  if (d.total_bytes < 0 || d.free_bytes < 0 || d.free_bytes > d.total_bytes)
    throw std::runtime_error(
        fmt::format("{}: {}: free_bytes {} and total_bytes {} must satisfy 0 <= free <= total",
                    label, where, d.free_bytes, d.total_bytes));
  d.kernel_ran = field<bool>(j, where, "kernel_ran", label);
  d.kernel_error = field<std::string>(j, where, "kernel_error", label);
  return d;
}

}  // namespace

Environment environment_from_json(const nlohmann::json& j, const std::string& label) {
  Environment e;
  e.source = label;
  const auto& t = j.contains("torch") ? j.at("torch") : nlohmann::json();
  e.torch_version = field<std::string>(t, "torch", "version", label);
  e.torch_cuda = field<bool>(t, "torch", "cuda", label);
  e.torch_cuda_version = field<std::string>(t, "torch", "cuda_version", label);
  e.cudnn_version = field<std::string>(t, "torch", "cudnn_version", label);
  e.nccl_version = field<std::string>(t, "torch", "nccl_version", label);
  e.gloo = field<bool>(t, "torch", "gloo", label);
  e.blas = field<std::string>(t, "torch", "blas", label);
  const auto& c = j.contains("cuda") ? j.at("cuda") : nlohmann::json();
  e.cuda.compiled = field<bool>(c, "cuda", "compiled", label);
  e.cuda.architectures = field<std::string>(c, "cuda", "architectures", label);
  e.cuda.runtime_version = field<int>(c, "cuda", "runtime_version", label);
  e.cuda.driver_version = field<int>(c, "cuda", "driver_version", label);
  e.cuda.error = field<std::string>(c, "cuda", "error", label);
  const auto devices = field<nlohmann::json>(c, "cuda", "devices", label);
  if (!devices.is_array())
    throw std::runtime_error(fmt::format("{}: field cuda.devices is not an array", label));
  for (size_t i = 0; i < devices.size(); ++i)
    e.cuda.devices.push_back(
        device_from_json(devices[i], fmt::format("cuda.devices[{}]", i), label));
  const auto& h = j.contains("host") ? j.at("host") : nlohmann::json();
  e.cores = field<int64_t>(h, "host", "cores", label);
  e.host_memory_bytes = field<int64_t>(h, "host", "memory_bytes", label);
  e.host_available_bytes = field<int64_t>(h, "host", "available_bytes", label);
  if (e.cores < 1 || e.host_memory_bytes < 1)
    throw std::runtime_error(
        fmt::format("{}: host.cores and host.memory_bytes must be positive", label));
  return e;
}

Environment load_environment(const std::string& path) {
  return environment_from_json(
      parse_json(read_whole_file(path, "the environment description"), path), path);
}

namespace {

std::string cuda_version(int v) {
  return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : "none";
}

std::string or_none(const std::string& s) { return s.empty() ? "none" : s; }

}  // namespace

std::string format_environment(const Environment& e) {
  std::string s = fmt::format("environment of {}\n", e.source);
  auto row = [&](const std::string& k, const std::string& v) {
    s += fmt::format("  {:<22} {}\n", k, v);
  };
  row("libtorch", e.torch_version + (e.torch_cuda ? " (CUDA build)" : " (CPU build)"));
  row("  built for CUDA", or_none(e.torch_cuda_version));
  row("  cuDNN", or_none(e.cudnn_version));
  row("  NCCL", or_none(e.nccl_version));
  row("  gloo", e.gloo ? "yes" : "no");
  row("  CPU BLAS", or_none(e.blas));
  row("dflash CUDA kernels", e.cuda.compiled ? "compiled for sm_" + e.cuda.architectures : "none");
  row("CUDA runtime", cuda_version(e.cuda.runtime_version));
  row("CUDA driver",
      e.cuda.driver_version > 0 ? cuda_version(e.cuda.driver_version) : "none (no NVIDIA driver)");
  row("CUDA devices",
      e.cuda.devices.empty() ? "none: " + e.cuda.error : std::to_string(e.cuda.devices.size()));
  for (const CudaDevice& d : e.cuda.devices)
    row(fmt::format("  cuda:{}", d.index),
        fmt::format("{}, sm_{}{}, {:.1f} GB total, {:.1f} GB free, probe kernel {}", d.name,
                    d.cc_major, d.cc_minor, d.total_bytes / 1e9, d.free_bytes / 1e9,
                    d.kernel_ran             ? "ok"
                    : d.kernel_error.empty() ? "not run"
                                             : "FAILED: " + d.kernel_error));
  row("host cores", std::to_string(e.cores));
  row("host memory", fmt::format("{:.1f} GB total, {:.1f} GB available", e.host_memory_bytes / 1e9,
                                 e.host_available_bytes / 1e9));
  return s;
}

}  // namespace dflash
