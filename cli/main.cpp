// dflash: one binary, CLI11 subcommands.
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"

int main(int argc, char** argv) {
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

  CLI11_PARSE(app, argc, argv);
  try {
    if (*s) return cmd_step(step);
    if (*d) return cmd_dump(dump);
    if (*v) return cmd_validate(val);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "dflash: error: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
