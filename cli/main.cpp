// dflash: one binary, CLI11 subcommands.
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <exception>

#include "cli/commands.h"
#include "core/step.h"
#include "harness/parity_run.h"
#include "harness/plan_run.h"
#include "harness/preflight.h"
#include "optimized/dist.h"
#include "optimized/train.h"

// libtorch's OpenMP threads spin after each parallel region by default and
// then fight OpenBLAS's own threads for the cores (measured: the optimized
// attention 2x slower on 2 cores). libgomp reads OMP_WAIT_POLICY only when
// it loads, so unless the user chose a policy, run again with PASSIVE.
void prefer_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("DFLASH_NO_REEXEC")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  setenv("DFLASH_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

int main(int argc, char** argv) {
  prefer_passive_openmp(argv);
  using namespace dflash::cli;
  CLI::App app{
      "dflash: DFlash drafter training, in a reference and an optimized build, "
      "with the harness that proves them equal"};
  app.require_subcommand(1);

  StepArgs step;
  auto* s = app.add_subcommand("step",
                               "Run one reference step and print loss, ce, kl, tau, "
                               "per-slot accuracy and the gradient norm");
  auto* s_cfg = s->add_option("--config", step.config, "Config TOML (fixture target and batch)")
                    ->check(CLI::ExistingFile);
  auto* s_from =
      s->add_option("--from", step.from, "Recompute the step stored in a dump (safetensors)")
          ->check(CLI::ExistingFile);
  s_cfg->excludes(s_from);
  s->add_option("--step", step.step, "Fixture step index (selects batch and anchors)");
  s->add_option("--threads", step.threads, "Intra-op threads (default: run.threads)");
  s->add_option("--build", step.build, "Which build computes the step")
      ->check(CLI::IsMember({"reference", "optimized"}));
  s->add_flag("--check", step.check,
              "With --from: exit 1 unless the recorded loss is reproduced bit for bit");
  s->callback([&] {
    if (step.config.empty() && step.from.empty()) throw CLI::RequiredError("--config or --from");
  });

  DumpArgs dump;
  auto* d = app.add_subcommand("dump",
                               "Write one reference step (inputs, parameters, outputs, "
                               "gradients, config) to a safetensors file");
  d->add_option("--config", dump.config, "Config TOML")->required()->check(CLI::ExistingFile);
  d->add_option("--out", dump.out, "Output .safetensors path")->required();
  d->add_option("--step", dump.step, "Fixture step index");
  d->add_option("--threads", dump.threads, "Intra-op threads (default: run.threads)");

  ValidateArgs val;
  auto* v = app.add_subcommand("validate",
                               "Parse and validate a config; optionally print "
                               "the resolved config");
  v->add_option("--config", val.config, "Config TOML")->required()->check(CLI::ExistingFile);
  v->add_option("--print", val.print, "Print the resolved config as toml or json")
      ->check(CLI::IsMember({"toml", "json"}));

  BenchArgs bench;
  auto* b = app.add_subcommand("bench", "Reference vs optimized on the same inputs: time ratio, "
                                        "peak-memory ratio, FLOPs and fraction of the GEMM rate");
  b->add_option("--case", bench.cases, "loss, attention, step (default: all)")
      ->check(CLI::IsMember({"loss", "attention", "step"}));
  b->add_flag("--quick", bench.quick, "CI-sized inputs (seconds instead of minutes)");
  b->add_option("--repeats", bench.repeats, "Runs per path; the best time is reported");
  b->add_option("--json", bench.json, "Also write the results as JSON");
  b->add_option("--threads", bench.threads, "Intra-op threads (default: OMP_NUM_THREADS or cores)");
  b->add_flag("--dist", bench.dist, "Transfer throughput, all-reduce busbw and waiting fraction of "
                                    "the target/drafter split (launches the config's ranks)");
  b->add_option("--config", bench.dist_config, "With --dist: the topology to run (default "
                                               "fixtures/configs/dist-1x2.toml)");

  dflash::harness::ParityOptions par;
  auto* p = app.add_subcommand("parity", "Gradient parity properties, the requires_grad audit, "
                                         "memory ceilings and the bug zoo; exit 1 on any failure");
  p->add_option("--cases", par.cases, "Cases per property (default 200)");
  p->add_option("--seed", par.seed, "RapidCheck seed (default 1)");
  p->add_option("--config", par.config, "Also audit this config (built at its own size)")
      ->check(CLI::ExistingFile);
  p->add_option("--reproduce", par.reproduce, "Replay one counterexample TOML")
      ->check(CLI::ExistingFile);
  p->add_option("--json", par.json, "Write the report as JSON");
  p->add_option("--junit", par.junit, "Write the report as JUnit XML");
  p->add_option("--out-dir", par.out_dir, "Where failing counterexamples are written");
  p->add_option("--mutant", par.mutant,
                "Check a parity-checked zoo mutant instead (shows a failure; with --reproduce, "
                "replays against it)");
  bool no_zoo = false;
  p->add_flag("--no-zoo", no_zoo, "Skip the bug zoo");

  std::string audit_config, audit_build = "optimized";
  auto* au = app.add_subcommand("audit", "The requires_grad / frozen-weight audit of one step");
  au->add_option("--config", audit_config, "Config TOML")->required()->check(CLI::ExistingFile);
  au->add_option("--build", audit_build, "reference or optimized")
      ->check(CLI::IsMember({"reference", "optimized"}));

  std::string plan_config, plan_json;
  bool plan_all = false;
  auto* pl = app.add_subcommand("plan", "Predict peak memory per rank, by component, and say OOM "
                                        "or fit for the config and its fallbacks");
  pl->add_option("--config", plan_config, "Config TOML")->required()->check(CLI::ExistingFile);
  pl->add_flag("--all-ranks", plan_all, "Break down every rank of every variant");
  pl->add_option("--json", plan_json, "Write the plans as JSON");

  dflash::harness::PreflightOptions pre;
  auto* pf = app.add_subcommand("preflight", "Before a run: validate, plan memory, check parity, "
                                             "the audit and memory ceilings on a scaled twin, "
                                             "and run one real step if this machine can");
  pf->add_option("--config", pre.config, "Config TOML")->required()->check(CLI::ExistingFile);
  pf->add_option("--json", pre.json, "Write the report as JSON");
  pf->add_option("--cases", pre.cases, "Cases per parity property (default 100)");
  pf->add_option("--seed", pre.seed, "Property seed (default 1)");
  pf->add_option("--mutant", pre.mutant, "Test hook: replace a component by a bug-zoo mutant");

  LaunchArgs launch;
  auto* la = app.add_subcommand("launch", "Run N local ranks (torchrun's environment) of a dflash "
                                          "subcommand: dflash launch --nproc N -- train --config C");
  la->add_option("--nproc", launch.nproc, "Number of ranks")->required();
  la->add_option("--grace", launch.grace_s, "Seconds between SIGTERM and SIGKILL when a rank fails");

  std::string train_config;
  dflash::train::TrainOptions topt;
  auto* tr = app.add_subcommand("train", "Train the drafter (one process, or the target/drafter "
                                         "split when launched with RANK / WORLD_SIZE)");
  tr->add_option("--config", train_config, "Config TOML")->required()->check(CLI::ExistingFile);
  tr->add_option("--steps", topt.steps, "Optimizer steps");
  tr->add_option("--micro-batches", topt.micro_batches,
                 "Micro-batches per step (default: one per drafter rank)");
  tr->add_option("--build", topt.build, "reference or optimized")
      ->check(CLI::IsMember({"reference", "optimized"}));
  tr->add_option("--lr", topt.optim.lr, "Peak learning rate");
  tr->add_option("--out-params", topt.out_params, "Write the final drafter parameters");
  tr->add_flag("--zoo-per-rank-normalisation", topt.per_rank_normalisation,
               "Bug-zoo hook: normalise the loss per rank (SPEC.md's bug)");
  tr->add_option("--fault", topt.fault, "Test hook: rank=R,step=T,mode=exit|hang");

  // `launch` hands everything after `--` to the ranks untouched: split argv
  // there and let CLI11 see only the launcher's own options.
  std::vector<char*> own(argv, argv + argc);
  if (argc > 1 && std::string(argv[1]) == "launch") {
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--") {
        launch.args.assign(argv + i + 1, argv + argc);
        own.resize(size_t(i));
        break;
      }
  }
  try {
    app.parse(int(own.size()), own.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  par.zoo = !no_zoo;
  try {
    if (*s) return cmd_step(step);
    if (*d) return cmd_dump(dump);
    if (*v) return cmd_validate(val);
    if (*b) return cmd_bench(bench);
    if (*p) {
      dflash::configure_threads(0);
      return dflash::harness::run_parity(par);
    }
    if (*pl) return dflash::harness::run_plan(plan_config, plan_all, plan_json);
    if (*la) return cmd_launch(launch);
    if (*tr) return dflash::train::run_train(train_config, topt);
    if (*pf) {
      dflash::configure_threads(0);
      return dflash::harness::run_preflight(pre);
    }
    if (*au) {
      dflash::configure_threads(0);
      return dflash::harness::run_audit(audit_config, audit_build);
    }
  } catch (const dflash::dist::DistError& e) {
    std::fprintf(stderr, "dflash: error: %s\n", e.what());
    return 3;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dflash: error: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
