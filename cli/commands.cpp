#include "cli/commands.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/device.h"
#include "core/env.h"
#include "core/hash.h"
#include "core/safetensors.h"
#include "core/step.h"
#include "decode/export.h"
#include "dist/cluster.h"
#include "dist/split_loop.h"
#include "fixtures/fixtures.h"
#include "harness/bench.h"
#include "harness/dump_check.h"
#include "harness/memory_guard.h"
#include "harness/step_dump.h"
#include "models/hf.h"
#include "optimized/step.h"
#include "reference/step.h"

namespace dflash::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

StepFn step_fn(const std::string& build) {
  return build == "optimized" ? StepFn(optimized::drafter_step) : StepFn(reference::drafter_step);
}

void print_step_table(const Config& c, const StepInputs& in, const StepResult& r,
                      const std::string& build, const std::string& source, int threads,
                      double secs) {
  const int64_t B = in.input_ids.size(0), S = in.input_ids.size(1);
  const int64_t N = in.anchors.num_anchors(), bs = c.data.block_size;
  fmt::print("dflash step  build={}  source={}\n", build, source);
  fmt::print("  dtype={} threads={}  B={} S={} N={} bs={} Q={} V={} H={} drafter_layers={}\n",
             dtype_name(c.run.dtype), threads, B, S, N, bs, N * bs, c.target.vocab_size,
             c.target.shape.hidden_size, c.drafter.num_hidden_layers);
  fmt::print("  kept blocks {} of {}, weight sum {:.6g}\n\n", r.out.kept_blocks.item<int64_t>(),
             B * N, r.out.weight_sum.item<double>());
  fmt::print("  {:<12} {:>16}\n", "metric", "value");
  fmt::print("  {:<12} {:>16.8f}\n", "loss", r.out.loss.item<double>());
  fmt::print("  {:<12} {:>16.8f}\n", "ce", r.out.ce.item<double>());
  fmt::print("  {:<12} {:>16.8f}\n", "kl", r.out.kl.item<double>());
  fmt::print("  {:<12} {:>16.8f}\n", "reverse_kl", r.out.reverse_kl.item<double>());
  fmt::print("  {:<12} {:>16.8f}\n", "jsd", r.out.jsd.item<double>());
  fmt::print("  {:<12} {:>16.8f}\n", "tv", r.out.tv.item<double>());
  fmt::print("  {:<12} {:>16.6f}\n", "tau", r.out.tau());
  fmt::print("  {:<12} {:>16.8e}\n", "grad norm", r.grad_norm);
  fmt::print("  {:<12} {:>16.3f}\n\n", "seconds", secs);
  const at::Tensor acc = r.out.accuracy();
  fmt::print("  {:<6} {:>10} {:>8} {:>8}\n", "slot", "accuracy", "correct", "counted");
  for (int64_t k = 0; k < bs; ++k)
    fmt::print("  {:<6} {:>10.4f} {:>8} {:>8}\n", k, acc[k].item<double>(),
               r.out.correct[k].item<int64_t>(), r.out.counted[k].item<int64_t>());
}

std::string bits_of(const at::Tensor& scalar) {
  if (scalar.scalar_type() == at::kDouble) {
    double v = scalar.item<double>();
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return fmt::format("{:.17g} (0x{:016x})", v, b);
  }
  float v = scalar.to(at::kFloat).item<float>();
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return fmt::format("{:.9g} (0x{:08x})", v, b);
}

}  // namespace

int cmd_step(const StepArgs& a) {
  if (!a.from.empty()) {
    harness::StepDump d = harness::read_step_dump(a.from);
    const int threads = configure_threads(a.threads >= 0 ? a.threads : d.config.run.threads);
    if (!a.device.empty()) {
      d.config.topology.device = a.device;
      validate_config(d.config);
    }
    const c10::Device dev = config_device(d.config);
    activate_device(dev, "dflash step --device");
    to_device(d.drafter, dev), to_device(d.frozen, dev);
    d.inputs = to_device(d.inputs, dev);
    const auto t0 = std::chrono::steady_clock::now();
    StepResult r = run_step(step_fn(a.build), d.config, d.drafter, d.frozen, d.inputs);
    print_step_table(d.config, d.inputs, r, a.build, a.from, threads, seconds_since(t0));
    const harness::DumpCheck check =
        harness::check_step_dump(d, r, harness::parse_dump_mode(a.compare));
    auto rec = d.recorded.find("output.loss");
    if (rec != d.recorded.end())
      fmt::print("\n  loss recorded   {}\n  loss recomputed {}\n", bits_of(rec->second),
                 bits_of(r.out.loss.detach().to(at::kCPU).to(rec->second.scalar_type())));
    fmt::print("\n{}", check.format());
    return (a.check && !check.ok()) ? 1 : 0;
  }
  Config c = load_config(a.config, a.set);
  fixtures::require_fixture_sources(c, "dflash step --config");
  if (!a.device.empty()) {
    c.topology.device = a.device;
    validate_config(c);
  }
  harness::guard_memory(
      c, a.build == "reference" ? harness::Workload::kReferenceStep : harness::Workload::kStep,
      "dflash step");
  const int threads = configure_threads(a.threads >= 0 ? a.threads : c.run.threads);
  const c10::Device dev = config_device(c);
  activate_device(dev, c.path + ": topology.device");
  const auto t0 = std::chrono::steady_clock::now();
  TargetWeights target = make_target(c);
  DrafterWeights drafter = make_drafter(c);
  // The fixture batch is built on the host, then the step runs on the device.
  const StepInputs in = to_device(fixtures::make_step_inputs(c, target, a.step), dev);
  to_device(target, dev), to_device(drafter, dev);
  StepResult r = run_step(step_fn(a.build), c, drafter, target.frozen(), in);
  print_step_table(c, in, r, a.build, a.config, threads, seconds_since(t0));
  return 0;
}

int cmd_dump(const DumpArgs& a) {
  const Config c = load_config(a.config, a.set);
  fixtures::require_fixture_sources(c, "dflash dump", /*hf_target_ok=*/true);
  harness::guard_memory(c, harness::Workload::kReferenceStep, "dflash dump");
  configure_threads(a.threads >= 0 ? a.threads : c.run.threads);
  const TargetWeights target = models::load_target(c);  // seeded, or a Hugging Face directory
  DrafterWeights drafter = make_drafter(c);
  if (!a.init_from.empty())
    decode::init_from_drafter(decode::read_drafter_dir(a.init_from), c, drafter);
  const StepInputs in = fixtures::make_step_inputs(c, target, a.step);
  StepResult r = run_step(reference::drafter_step, c, drafter, target.frozen(), in);
  harness::write_step_dump(a.out, c, drafter, target.frozen(), in, r);
  fmt::print("wrote {}: loss {}\n", a.out, bits_of(r.out.loss.detach()));
  return 0;
}

int cmd_validate(const ValidateArgs& a) {
  const Config c = load_config(a.config, a.set);
  if (a.print == "json")
    fmt::print("{}\n", config_to_json(c).dump(2));
  else if (a.print == "toml")
    fmt::print("{}", config_to_toml(c));
  else
    fmt::print("{}: ok\n", a.config);
  return 0;
}

int cmd_bench(const BenchArgs& a) {
  if (a.dist) {
    // Inside launched ranks run the bench; otherwise launch the config's ranks.
    const Config c = load_config(a.dist_config, a.set);
    if (dist::env_from_process().present) return dist::run_dist_bench(c);
    harness::guard_memory(c, harness::Workload::kTrain, "dflash bench --dist");
    LaunchArgs l;
    l.nproc = c.topology.world_size;
    l.args = {"bench", "--dist", "--config", a.dist_config};
    for (const std::string& kv : a.set) l.args.insert(l.args.end(), {"--set", kv});
    return cmd_launch(l);
  }
  configure_threads(a.threads);
  return harness::run_bench({a.cases, a.quick, a.repeats, a.json, a.device, a.kernels});
}

namespace {
// FNV-1a 64 of a tensor's bytes (row-major): a checksum other tools can
// recompute in a few lines (ci/safetensors_interop.py does).
uint64_t fnv1a64(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return dflash::fnv1a64(c.data_ptr(), size_t(c.nbytes()));
}
}  // namespace

int cmd_inspect(const InspectArgs& a) {
  const safetensors::File f = safetensors::read(a.file);
  nlohmann::json j = {
      {"file", a.file}, {"metadata", f.metadata}, {"tensors", nlohmann::json::array()}};
  fmt::print("{}: {} tensors, {} metadata keys\n", a.file, f.tensors.size(), f.metadata.size());
  for (const auto& [name, t] : f.tensors) {
    const std::string hash = fmt::format("{:016x}", fnv1a64(t));
    j["tensors"].push_back({{"name", name},
                            {"dtype", safetensors::dtype_code(t.scalar_type())},
                            {"shape", t.sizes().vec()},
                            {"fnv1a64", hash}});
    fmt::print("  {:<40} {:<5} {:<20} {}\n", name, safetensors::dtype_code(t.scalar_type()),
               fmt::format("[{}]", fmt::join(t.sizes(), ", ")), hash);
  }
  for (const auto& [k, v] : f.metadata)
    fmt::print("  __metadata__.{} = {}\n", k, v.size() > 60 ? v.substr(0, 57) + "..." : v);
  if (a.json == "-")
    fmt::print("{}\n", j.dump(1));
  else if (!a.json.empty())
    safetensors::write_file_atomic(a.json, j.dump(1) + "\n");
  return 0;
}

int cmd_env(const EnvArgs& a) {
  const Environment e = probe_environment(!a.no_kernel);
  const std::string json = environment_to_json(e).dump(2) + "\n";
  if (a.json == "-") {
    std::fputs(json.c_str(), stdout);
    return 0;
  }
  std::fputs(format_environment(e).c_str(), stdout);
  if (!a.json.empty()) safetensors::write_file_atomic(a.json, json);
  return 0;
}

}  // namespace dflash::cli
