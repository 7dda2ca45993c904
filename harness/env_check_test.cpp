// Preflight's environment check against described machines (no GPU needed):
// the seed's 8-GPU topology on eight H200s passes; on this kind of machine
// (no CUDA), on too few devices, on too-small devices, with a failed probe
// kernel and with a CPU-only libtorch it fails naming what is missing.
// Descriptions round-trip through the JSON that `dflash env --json` writes.
#include "harness/env_check.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace dflash::harness {
namespace {

std::string source_dir() {
  const char* root = std::getenv("DFLASH_SOURCE_DIR");
  return root ? root : ".";
}

Config seed() { return load_config(source_dir() + "/fixtures/configs/seed-8gpu.toml"); }
Environment h200x8() { return load_environment(source_dir() + "/fixtures/envs/h200x8.json"); }

// This machine's kind: a CUDA libtorch, no driver, no device.
Environment no_gpu() {
  Environment e = h200x8();
  e.cuda.devices.clear();
  e.cuda.driver_version = 0;
  e.cuda.error = "cudaErrorInsufficientDriver: CUDA driver version is insufficient";
  return e;
}

bool mentions(const EnvVerdict& v, const std::string& s) {
  return (v.figure + "\n" + v.detail).find(s) != std::string::npos;
}

TEST(EnvCheck, SeedOnEightH200sPasses) {
  const EnvVerdict v = check_environment(seed(), h200x8(), 0);
  EXPECT_TRUE(v.ok) << v.detail;
  EXPECT_TRUE(mentions(v, "8 of 8 devices")) << v.figure;
}

TEST(EnvCheck, CudaConfigWithoutDeviceFailsAndSaysHowToPlanElsewhere) {
  const EnvVerdict v = check_environment(seed(), no_gpu(), 0);
  EXPECT_FALSE(v.ok);
  EXPECT_TRUE(mentions(v, "topology.device = \"cuda\"")) << v.detail;
  EXPECT_TRUE(mentions(v, "cudaErrorInsufficientDriver")) << v.detail;
  EXPECT_TRUE(mentions(v, "--plan-for-another-machine")) << v.detail;
}

// topology.device = "cuda:N": the node's ranks share device N (how the GPU
// check runs three ranks on one GPU).
TEST(EnvCheck, PinnedDeviceIsSharedByTheNodesRanks) {
  Config c = seed();
  c.topology.device = "cuda:3";
  c.topology.device_memory_gb.assign(8, 17.0);  // 8 x 17 GB fit one 143 GB H200
  const EnvVerdict ok = check_environment(c, h200x8(), 0);
  EXPECT_TRUE(ok.ok) << ok.detail;
  EXPECT_TRUE(mentions(ok, "cuda:3: 8 ranks on one device")) << ok.figure;
  c.topology.device_memory_gb.assign(8, 20.0);  // 160 GB do not
  const EnvVerdict full = check_environment(c, h200x8(), 0);
  EXPECT_FALSE(full.ok);
  EXPECT_TRUE(mentions(full, "share it")) << full.detail;
  Environment two = h200x8();
  two.cuda.devices.resize(2);
  const EnvVerdict missing = check_environment(c, two, 0);
  EXPECT_FALSE(missing.ok);
  EXPECT_TRUE(mentions(missing, "topology.device = \"cuda:3\", but")) << missing.detail;
}

TEST(EnvCheck, CpuOnlyLibtorchFails) {
  Environment e = h200x8();
  e.torch_cuda = false;
  const EnvVerdict v = check_environment(seed(), e, 0);
  EXPECT_FALSE(v.ok);
  EXPECT_TRUE(mentions(v, "CPU build")) << v.detail;
}

TEST(EnvCheck, MoreLocalRanksThanDevicesFails) {
  EXPECT_FALSE(check_environment(seed(), h200x8(), 9).ok);  // torchrun's LOCAL_WORLD_SIZE
  Environment four = h200x8();
  four.cuda.devices.resize(4);
  const EnvVerdict v = check_environment(seed(), four, 0);  // all 8 ranks here, 4 devices
  EXPECT_FALSE(v.ok);
  EXPECT_TRUE(mentions(v, "8 ranks run on this node")) << v.detail;
  EXPECT_TRUE(mentions(v, "4 CUDA devices")) << v.detail;
  // Four ranks of this node on four devices is fine.
  EXPECT_TRUE(check_environment(seed(), four, 4).ok);
}

TEST(EnvCheck, DeviceSmallerThanPlannedFailsNamingBothNumbers) {
  const Environment a100 = load_environment(source_dir() + "/fixtures/envs/a100-80gb-x8.json");
  const EnvVerdict v = check_environment(seed(), a100, 0);  // seed plans 95 GB per rank
  EXPECT_FALSE(v.ok);
  EXPECT_TRUE(mentions(v, "device_memory_gb[0] = 95")) << v.detail;
  EXPECT_TRUE(mentions(v, "85.10 GB")) << v.detail;
  EXPECT_TRUE(mentions(v, "A100")) << v.detail;
  // Exactly the planned memory passes (the boundary is inclusive).
  Environment exact = a100;
  for (auto& d : exact.cuda.devices) d.total_bytes = int64_t(95e9);
  EXPECT_TRUE(check_environment(seed(), exact, 0).ok);
}

TEST(EnvCheck, FailedProbeKernelFails) {
  Environment e = h200x8();
  e.cuda.devices[3].kernel_ran = false;
  e.cuda.devices[3].kernel_error = "cudaErrorNoKernelImageForDevice";
  const EnvVerdict v = check_environment(seed(), e, 0);
  EXPECT_FALSE(v.ok);
  EXPECT_TRUE(mentions(v, "cuda:3")) << v.detail;
}

// The torch this build is meant to have: $DFLASH_EXPECT_TORCH (ci/torch-newest.sh
// sets it), else the default of cmake/TORCH_VERSION.
std::string expected_torch() {
  if (const char* v = std::getenv("DFLASH_EXPECT_TORCH")) return v;
  std::ifstream f(source_dir() + "/cmake/TORCH_VERSION");
  std::string line;
  std::getline(f, line);
  return line;
}

TEST(EnvCheck, CpuConfigPassesHere) {
  const Config tiny = load_config(source_dir() + "/fixtures/configs/tiny.toml");
  const EnvVerdict v = check_environment(tiny, probe_environment(false), 0);
  EXPECT_TRUE(v.ok) << v.detail;
  EXPECT_TRUE(mentions(v, "libtorch " + expected_torch())) << v.figure;
}

TEST(EnvDescription, RoundTripsThroughJson) {
  const Environment e = probe_environment(false);
  const Environment back = environment_from_json(environment_to_json(e), "round trip");
  EXPECT_EQ(environment_to_json(back), environment_to_json(e));
  EXPECT_EQ(e.torch_version, expected_torch());
  EXPECT_GT(e.cores, 0);
  EXPECT_GT(e.host_memory_bytes, 0);
}

TEST(EnvDescription, BadFieldIsNamed) {
  nlohmann::json j = environment_to_json(h200x8());
  j["cuda"]["devices"][2]["total_bytes"] = "lots";
  try {
    environment_from_json(j, "x.json");
    FAIL() << "accepted a string as total_bytes";
  } catch (const std::runtime_error& err) {
    EXPECT_NE(std::string(err.what()).find("x.json: field cuda.devices[2].total_bytes"),
              std::string::npos)
        << err.what();
  }
  j = environment_to_json(h200x8());
  j["host"].erase("cores");
  EXPECT_THROW(environment_from_json(j, "x.json"), std::runtime_error);
}

}  // namespace
}  // namespace dflash::harness
