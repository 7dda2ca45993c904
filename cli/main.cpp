// dflash: one binary, CLI11 subcommands. Each subcommand registers its
// options and the action that runs it; main() dispatches.
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/config.h"
#include "core/step.h"
#include "data/data.h"
#include "decode/eval.h"
#include "decode/export.h"
#include "dist/cluster.h"
#include "dist/split_loop.h"
#include "harness/memory_guard.h"
#include "harness/parity_run.h"
#include "harness/plan_run.h"
#include "harness/preflight.h"
#include "train/lm.h"
#include "train/loop.h"
#include "train/report.h"

namespace {

using namespace dflash;
using namespace dflash::cli;

// The subcommands: each add_* registers options bound to state it owns and
// returns the action to run when that subcommand was chosen.
struct Subcommands {
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  void add(CLI::App* sub, std::function<int()> run) { actions.emplace_back(sub, std::move(run)); }
};

// --set KEY=VALUE, the same on every command that reads a config.
CLI::Option* add_set(CLI::App* sub, std::vector<std::string>& set, const std::string& more = "") {
  return sub->add_option(
      "--set", set,
      "Override a config key, KEY=VALUE (repeatable; e.g. loss.weighting=dpace): "
      "checked like the file" +
          more);
}

// Options that only tests use stay out of the user's --help.
CLI::Option* test_hook(CLI::Option* o) { return o->group(""); }

void add_step(CLI::App& app, Subcommands& subs) {
  auto a = std::make_shared<StepArgs>();
  auto* s = app.add_subcommand("step",
                               "Run one step (reference or optimized build) and print loss, "
                               "ce, kl, tau, per-slot accuracy and the gradient norm");
  auto* cfg = s->add_option("--config", a->config, "Config TOML (fixture target and batch)")
                  ->check(CLI::ExistingFile);
  auto* from = s->add_option("--from", a->from, "Recompute the step stored in a dump (safetensors)")
                   ->check(CLI::ExistingFile);
  cfg->excludes(from);
  add_set(s, a->set)->excludes(from);
  s->add_option("--step", a->step, "Fixture step index (selects batch and anchors)");
  s->add_option("--threads", a->threads, "Intra-op threads")->default_str("run.threads");
  s->add_option("--build", a->build, "Which build computes the step")
      ->check(CLI::IsMember({"reference", "optimized"}));
  s->add_flag("--check", a->check,
              "With --from: exit 1 unless every recorded output and gradient agrees (--compare)");
  s->add_option("--compare", a->compare,
                "With --from: bitwise (every tensor bit for bit: dflash's own dumps), tolerance "
                "(the harness's error ratio against the float64 reference, in the dump's dtype: "
                "another trainer's dump) or auto (bitwise when the dump's producer is dflash)")
      ->check(CLI::IsMember({"auto", "bitwise", "tolerance"}));
  s->add_option("--device", a->device,
                "Run the step on cpu, cuda or cuda:N (default: the config's topology.device)");
  s->callback([a] {
    if (a->config.empty() && a->from.empty()) throw CLI::RequiredError("--config or --from");
  });
  subs.add(s, [a] { return cmd_step(*a); });
}

void add_dump_and_validate(CLI::App& app, Subcommands& subs) {
  auto d = std::make_shared<DumpArgs>();
  auto* ds = app.add_subcommand("dump",
                                "Write one reference step (inputs, parameters, outputs, "
                                "gradients, config) to a safetensors file");
  ds->add_option("--config", d->config, "Config TOML")->required()->check(CLI::ExistingFile);
  ds->add_option("--out", d->out, "Output .safetensors path")->required();
  add_set(ds, d->set);
  ds->add_option("--step", d->step, "Fixture step index");
  ds->add_option("--init-from", d->init_from,
                 "The drafter of this directory (a dflash checkpoint, zlab or speculators) "
                 "instead of the seeded one")
      ->check(CLI::ExistingDirectory)
      ->default_str("the config's seeded drafter");
  ds->add_option("--threads", d->threads, "Intra-op threads")->default_str("run.threads");
  subs.add(ds, [d] { return cmd_dump(*d); });

  auto v = std::make_shared<ValidateArgs>();
  auto* vs = app.add_subcommand(
      "validate", "Parse and validate a config; optionally print the resolved config");
  vs->add_option("--config", v->config, "Config TOML")->required()->check(CLI::ExistingFile);
  add_set(vs, v->set);
  vs->add_option("--print", v->print, "Print the resolved config as toml or json")
      ->check(CLI::IsMember({"toml", "json"}));
  subs.add(vs, [v] { return cmd_validate(*v); });
}

void add_bench(CLI::App& app, Subcommands& subs) {
  auto a = std::make_shared<BenchArgs>();
  auto* b = app.add_subcommand("bench",
                               "Reference vs optimized on the same inputs: time ratio, "
                               "peak-memory ratio, FLOPs and fraction of the GEMM rate");
  b->add_option("--case", a->cases,
                "loss, objectives (the fused loss per objective vs CE + KL), attention, step "
                "(default: all)")
      ->check(CLI::IsMember({"loss", "objectives", "attention", "step"}));
  b->add_flag("--quick", a->quick, "CI-sized inputs (seconds instead of minutes)");
  b->add_option("--repeats", a->repeats, "Runs per path; the best time is reported");
  b->add_option("--json", a->json, "Also write the results as JSON");
  b->add_option("--threads", a->threads, "Intra-op threads (0: OMP_NUM_THREADS, else every core)");
  b->add_option("--device", a->device,
                "cpu, cuda or cuda:N (CUDA: bf16 at the GPU sizes of docs/GPU.md unless --quick)");
  b->add_option("--kernels", a->kernels,
                "The optimized path's row work: auto (host on CPU, aten on CUDA), host, aten")
      ->check(CLI::IsMember({"auto", "host", "aten"}));
  b->add_flag("--dist", a->dist,
              "Transfer throughput, all-reduce busbw and waiting fraction of "
              "the target/drafter split (launches the config's ranks)");
  b->add_option("--config", a->dist_config, "With --dist: the topology to run");
  add_set(b, a->set, " (with --dist; forwarded to every rank)");
  subs.add(b, [a] { return cmd_bench(*a); });
}

void add_harness(CLI::App& app, Subcommands& subs) {
  auto p = std::make_shared<harness::ParityOptions>();
  auto no_zoo = std::make_shared<bool>(false);
  auto* ps = app.add_subcommand("parity",
                                "Gradient parity properties, the requires_grad audit, "
                                "memory ceilings and the bug zoo; exit 1 on any failure");
  ps->add_option("--cases", p->cases, "Cases per property");
  ps->add_option("--seed", p->seed, "RapidCheck seed");
  ps->add_option("--config", p->config, "Also audit this config (built at its own size)")
      ->check(CLI::ExistingFile);
  add_set(ps, p->set, " (with --config)");
  ps->add_option("--reproduce", p->reproduce, "Replay one counterexample TOML")
      ->check(CLI::ExistingFile);
  ps->add_option("--json", p->json, "Write the report as JSON");
  ps->add_option("--junit", p->junit, "Write the report as JUnit XML");
  ps->add_option("--out-dir", p->out_dir, "Where failing counterexamples are written");
  ps->add_option("--mutant", p->mutant,
                 "Check a zoo mutant instead (shows a failure; with "
                 "--reproduce, replays against it)");
  ps->add_flag("--no-zoo", *no_zoo, "Skip the bug zoo");
  ps->add_option("--device", p->device,
                 "Run the optimized candidate on cpu, cuda or cuda:N; the references stay on "
                 "the CPU in float64");
  ps->add_flag("--measure-tolerances", p->measure_tolerances,
               "Instead of the checks: tabulate the error ratios and floors the real code "
               "needs, per property, dtype and tensor (docs/HARNESS.md)");
  ps->add_flag("--per-objective", p->per_objective,
               "With --measure-tolerances: the loss's table per objective and weighting, "
               "float32 and bfloat16, random and near-agreement cases");
  subs.add(ps, [p, no_zoo] {
    configure_threads(0);
    p->zoo = !*no_zoo;
    return harness::run_parity(*p);
  });

  struct AuditArgs {
    std::string config, from, build = "optimized";
    std::vector<std::string> set;
  };
  auto au = std::make_shared<AuditArgs>();
  auto* as = app.add_subcommand("audit", "The requires_grad / frozen-weight audit of one step");
  auto* acfg = as->add_option("--config", au->config, "Config TOML")->check(CLI::ExistingFile);
  auto* afrom = as->add_option("--from", au->from,
                               "Audit the gradients recorded in a step dump (another trainer's, "
                               "written by dflash.dump_step: docs/PYTORCH.md)")
                    ->check(CLI::ExistingFile);
  acfg->excludes(afrom);
  add_set(as, au->set)->excludes(afrom);
  as->add_option("--build", au->build, "reference or optimized")
      ->check(CLI::IsMember({"reference", "optimized"}));
  as->callback([au] {
    if (au->config.empty() && au->from.empty()) throw CLI::RequiredError("--config or --from");
  });
  subs.add(as, [au] {
    configure_threads(0);
    if (!au->from.empty()) return harness::run_audit_dump(au->from);
    return harness::run_audit(load_config(au->config, au->set), au->build);
  });
}

void add_plan_and_preflight(CLI::App& app, Subcommands& subs) {
  struct PlanArgs {
    std::string config, json;
    std::vector<std::string> set;
    bool all = false;
  };
  auto pa = std::make_shared<PlanArgs>();
  auto* pl = app.add_subcommand("plan",
                                "Predict peak memory per rank, by component, and say OOM "
                                "or fit for the config and its fallbacks");
  pl->add_option("--config", pa->config, "Config TOML")->required()->check(CLI::ExistingFile);
  add_set(pl, pa->set);
  pl->add_flag("--all-ranks", pa->all, "Break down every rank of every variant");
  pl->add_option("--json", pa->json, "Write the plans as JSON");
  subs.add(pl,
           [pa] { return harness::run_plan(load_config(pa->config, pa->set), pa->all, pa->json); });

  auto pre = std::make_shared<harness::PreflightOptions>();
  auto* pf = app.add_subcommand("preflight",
                                "Before a run: validate, plan memory, check parity, the "
                                "audit and memory ceilings on a scaled twin, and run one "
                                "real step if this machine can");
  pf->add_option("--config", pre->config, "Config TOML")->required()->check(CLI::ExistingFile);
  add_set(pf, pre->set);
  pf->add_option("--json", pre->json, "Write the report as JSON");
  pf->add_option("--cases", pre->cases, "Cases per parity property");
  pf->add_option("--seed", pre->seed, "Property seed");
  test_hook(pf->add_option("--mutant", pre->mutant,
                           "Test hook: replace a component by a bug-zoo mutant"));
  pf->add_option("--device", pre->device,
                 "Override topology.device (cpu, cuda, cuda:N): the config's run on that device");
  pf->add_option("--out-dir", pre->out_dir, "Where a failing twin-parity case is written");
  auto* env_file = pf->add_option("--env", pre->env_file,
                                  "Check the topology against this machine description "
                                  "(`dflash env --json` on that machine) instead of this one")
                       ->check(CLI::ExistingFile);
  pf->add_flag("--plan-for-another-machine", pre->plan_for_another_machine,
               "Skip only the environment check (the verdict says so)")
      ->excludes(env_file);
  subs.add(pf, [pre] {
    configure_threads(0);
    return harness::run_preflight(*pre);
  });
}

void add_train_and_launch(CLI::App& app, Subcommands& subs, LaunchArgs& launch) {
  auto* la = app.add_subcommand("launch",
                                "Run N local ranks (torchrun's environment) of a dflash "
                                "subcommand: dflash launch --nproc N -- train --config C");
  la->add_option("--nproc", launch.nproc, "Number of ranks on this node")->required();
  la->add_option("--nnodes", launch.nnodes, "Nodes in the run: one launcher per node");
  la->add_option("--node-rank", launch.node_rank,
                 "This node (0 serves the rendezvous); ranks node_rank * nproc + [0, nproc)");
  la->add_option("--master-addr", launch.master_addr, "Node 0's address")
      ->default_str("$MASTER_ADDR, else 127.0.0.1 on one node");
  la->add_option("--master-port", launch.master_port, "Rendezvous port")
      ->default_str("$MASTER_PORT, else a free port on one node");
  la->add_option("--grace", launch.grace_s,
                 "Seconds between SIGTERM and SIGKILL when a rank fails");
  subs.add(la, [&launch] { return cmd_launch(launch); });

  auto o = std::make_shared<train::RunOptions>();
  auto* tr = app.add_subcommand("train",
                                "Train the drafter: preflight, then the run (one process, or the "
                                "target/drafter split when launched with RANK / WORLD_SIZE)");
  tr->add_option("--config", o->config, "Config TOML")->required()->check(CLI::ExistingFile);
  add_set(tr, o->set, ", recorded in the run's config.toml");
  tr->add_option("--steps", o->steps, "Optimizer steps")->default_str("train.steps");
  tr->add_option("--micro-batches", o->micro_batches,
                 "Micro-batches per step (split: one per drafter)")
      ->default_str("train.micro_batches");
  tr->add_option("--lr", o->lr, "Peak learning rate")->default_str("train.lr");
  tr->add_option("--out-dir", o->out_dir, "Run directory")
      ->default_str("train.out_dir, else runs/<stem>");
  tr->add_flag("--resume", o->resume, "Continue from the run directory's newest checkpoint");
  tr->add_flag("--skip-preflight", o->skip_preflight,
               "Start without the preflight checks (says loudly what is skipped)");
  tr->add_option("--preflight-cases", o->preflight_cases, "Parity cases per property in the gate");
  tr->add_option("--build", o->build, "reference or optimized")
      ->check(CLI::IsMember({"reference", "optimized"}));
  tr->add_option("--out-params", o->out_params, "Also write the final drafter parameters here");
  tr->add_option("--init-from", o->init_from,
                 "Start from this drafter: a dflash checkpoint, or a zlab / speculators "
                 "directory (docs/SERVING.md); checked against the config")
      ->check(CLI::ExistingDirectory);
  tr->add_option("--device", o->device,
                 "Override topology.device: cpu, cuda or cuda:N (one process; docs/GPU.md)");
  test_hook(tr->add_option("--test-poison-step", o->poison_step,
                           "Test hook: write a NaN into fc.weight before this step"));
  test_hook(tr->add_flag("--zoo-per-rank-normalisation", o->per_rank_normalisation,
                         "Bug-zoo hook: normalise the loss per rank (SPEC.md's bug)"));
  test_hook(tr->add_option("--fault", o->fault, "Test hook: rank=R,step=T,mode=exit|hang"));
  subs.add(tr, [o] { return train::run_training(*o); });

  auto lm = std::make_shared<train::LmRecipe>();
  auto* tt = app.add_subcommand(
      "train-target",
      "Train the real-text target (a tiny byte-level Qwen3 LM) and write it as a Hugging Face "
      "directory; the defaults are the recipe of fixtures/targets/qwen3-bytes");
  tt->add_option("--out", lm->out, "Output directory (Hugging Face layout)")->required();
  tt->add_option("--corpus", lm->corpus, "Directory of UTF-8 text files (Debian's licenses)");
  tt->add_option("--holdout", lm->holdout, "File of the corpus held out for evaluation");
  tt->add_option("--steps", lm->steps, "Optimizer steps");
  tt->add_option("--seq-len", lm->seq_len, "Bytes per training window");
  tt->add_option("--batch-size", lm->batch_size, "Windows per step");
  tt->add_option("--lr", lm->lr, "Peak learning rate");
  tt->add_option("--hidden-size", lm->hidden_size, "Model width");
  tt->add_option("--layers", lm->num_layers, "Decoder layers");
  tt->add_option("--intermediate-size", lm->intermediate_size, "MLP width");
  tt->add_option("--seed", lm->seed, "Seed (init and batches)");
  tt->add_option("--threads", lm->threads, "Intra-op threads (0: every core)");
  subs.add(tt, [lm] {
    train::train_byte_lm(*lm);
    return 0;
  });

  auto ev = std::make_shared<decode::EvalOptions>();
  auto* es = app.add_subcommand(
      "eval",
      "Served acceptance of a drafter checkpoint: block and tree speculative decoding against "
      "plain greedy, beside the teacher-forced tau (docs/EVAL.md)");
  es->add_option("checkpoint", ev->checkpoint, "Checkpoint directory, or a run directory (newest)")
      ->required()
      ->check(CLI::ExistingDirectory);
  es->add_option("--target", ev->target, "Hugging Face target directory")->default_str("the run's");
  es->add_option("--prompts", ev->prompts,
                 "Prompt file: one text prompt per line, or .jsonl of {\"text\"} / {\"ids\"} "
                 "(default: the run's held-out prompts)");
  es->add_option("--num-prompts", ev->num_prompts, "Held-out prompts to decode")
      ->check(CLI::Range(int64_t(1), int64_t(65536)));
  es->add_option("--tokens", ev->max_new_tokens, "Tokens generated per prompt")
      ->check(CLI::Range(int64_t(1), int64_t(1000000)));
  es->add_option("--block-size", ev->block_size, "Served block size")
      ->check(CLI::Range(int64_t(2), int64_t(4096)))
      ->default_str("the trained one");
  es->add_option("--budgets", ev->budgets, "Tree node budgets")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  es->add_option("--max-context", ev->max_context, "Context limit")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
      ->default_str("the target's max_position_embeddings");
  es->add_option("--json", ev->json, "Also write the report as JSON");
  es->add_option("--build", ev->build, "The step computing tau: reference or optimized")
      ->check(CLI::IsMember({"reference", "optimized"}));
  es->add_option("--threads", ev->threads, "Intra-op threads (0: every core)");
  subs.add(es, [ev] { return decode::run_eval(*ev); });

  auto ex = std::make_shared<decode::ExportOptions>();
  auto* xs = app.add_subcommand(
      "export",
      "Write a checkpoint's drafter in the layout vLLM and SGLang (zlab) or speculators load "
      "(docs/SERVING.md)");
  xs->add_option("checkpoint", ex->source, "Checkpoint directory, or a run directory (newest)")
      ->required()
      ->check(CLI::ExistingDirectory);
  xs->add_option("--format", ex->format, "zlab or speculators")
      ->required()
      ->check(CLI::IsMember({"zlab", "speculators"}));
  xs->add_option("--out", ex->out, "Output directory (must not exist)")->required();
  xs->add_option("--dtype", ex->dtype, "Stored dtype")
      ->check(CLI::IsMember({"bfloat16", "float32"}))
      ->capture_default_str();
  xs->add_option("--verifier", ex->verifier, "The target's Hugging Face directory")
      ->check(CLI::ExistingDirectory)
      ->default_str("the run's target");
  subs.add(xs, [ex] { return decode::run_export(*ex); });

  struct FeatureArgs {
    std::string config, out;
    std::vector<std::string> set;
    int64_t shard = 256;
    std::string engine = "auto";
  };
  auto fa = std::make_shared<FeatureArgs>();
  auto* fe = app.add_subcommand("features",
                                "Precompute the target's features for offline training "
                                "(data.source = \"features\")");
  fe->add_option("--config", fa->config, "Config TOML")->required()->check(CLI::ExistingFile);
  add_set(fe, fa->set);
  fe->add_option("--out", fa->out, "Output directory (must not exist)")->required();
  fe->add_option("--shard-samples", fa->shard, "Samples per shard");
  fe->add_option("--engine", fa->engine,
                 "Who runs the target: dflash (qwen3, llama), transformers (any architecture "
                 "it loads; target.source = \"hf\"), or auto (dflash when it can)")
      ->check(CLI::IsMember({"auto", "dflash", "transformers"}));
  subs.add(fe, [fa] {
    return data::write_features(load_config(fa->config, fa->set), fa->out, fa->shard,
                                {fa->engine, torch_python(), python_dir()});
  });

  auto run_dir = std::make_shared<std::string>();
  auto* rp = app.add_subcommand("report", "Write RUN_DIR/report.html (curves, config, preflight)");
  rp->add_option("run_dir", *run_dir, "Run directory")->required()->check(CLI::ExistingDirectory);
  subs.add(rp, [run_dir] {
    std::printf("report: %s\n", train::write_report(*run_dir).c_str());
    return 0;
  });
}

void add_inspect(CLI::App& app, Subcommands& subs) {
  auto a = std::make_shared<InspectArgs>();
  auto* i = app.add_subcommand("inspect", "List a safetensors file's tensors and metadata");
  i->add_option("file", a->file, "A .safetensors file")->required();
  i->add_option("--json", a->json, "Also write the listing as JSON (- for stdout)");
  subs.add(i, [a] { return cmd_inspect(*a); });
}

// `prepare` is Python (transformers renders chat templates): every argument,
// --help included, goes to python/dflash/prepare.py.
void add_prepare(CLI::App& app, Subcommands& subs) {
  auto* p = app.add_subcommand(
      "prepare",
      "Chat data (ShareGPT / OpenAI JSON or JSONL) through the target's tokenizer and chat "
      "template into dflash train's JSONL, assistant-only loss mask (docs/CHAT_DATA.md)");
  p->prefix_command();
  p->set_help_flag();
  subs.add(p, [p] { return cmd_prepare(p->remaining()); });
}

void add_env(CLI::App& app, Subcommands& subs) {
  auto a = std::make_shared<EnvArgs>();
  auto* e = app.add_subcommand("env",
                               "What this machine offers a run: libtorch build, CUDA runtime, "
                               "driver and devices, cores and memory");
  e->add_option("--json", a->json, "Also write the description as JSON (- for stdout)");
  e->add_flag("--no-kernel", a->no_kernel, "Do not run dflash's probe kernel on each device");
  subs.add(e, [a] { return cmd_env(*a); });
}

// `launch` hands everything after `--` to the ranks untouched: split argv
// there and let CLI11 see only the launcher's own options.
std::vector<char*> own_arguments(int argc, char** argv, LaunchArgs& launch) {
  std::vector<char*> own(argv, argv + argc);
  if (argc > 1 && std::string(argv[1]) == "launch")
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--") {
        launch.args.assign(argv + i + 1, argv + argc);
        own.resize(size_t(i));
        break;
      }
  return own;
}

// Edit distance (insertions, deletions, substitutions, adjacent swaps).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// A first word that names no subcommand: say so, with the nearest names.
// Returns "" when `word` is a subcommand (or an option).
std::string unknown_command(CLI::App& app, const std::string& word) {
  if (word.empty() || word[0] == '-') return "";
  std::vector<std::string> names, near;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == word) return "";
    names.push_back(sub->get_name());
  }
  for (const std::string& n : names)
    if (edit_distance(word, n) <= std::max<size_t>(1, n.size() / 3) ||
        (word.size() >= 3 && n.rfind(word, 0) == 0))
      near.push_back("'" + n + "'");
  std::string msg = "dflash: unknown command '" + word + "'";
  if (!near.empty()) msg += "; did you mean " + CLI::detail::join(near, " or ") + "?";
  return msg + "\nThe commands: " + CLI::detail::join(names, ", ") +
         " (dflash --help says what each does)\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dflash: DFlash drafter training, in a reference and an optimized build, "
      "with the harness that proves them equal"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text());
  // Every option's default in --help (set before the subcommands copy it).
  app.option_defaults()->always_capture_default();
  Subcommands subs;
  LaunchArgs launch;
  add_step(app, subs);
  add_dump_and_validate(app, subs);
  add_bench(app, subs);
  add_harness(app, subs);
  add_plan_and_preflight(app, subs);
  add_train_and_launch(app, subs, launch);
  add_env(app, subs);
  add_inspect(app, subs);
  add_prepare(app, subs);
  // Commands that build model-sized tensors check the planner's estimate
  // first (harness/memory_guard.h); this flag lets them allocate anyway.
  bool ignore_memory_plan = false;
  for (const char* name : {"step", "dump", "audit", "parity", "train", "features", "bench"})
    app.get_subcommand(name)->add_flag(
        "--ignore-memory-plan", ignore_memory_plan,
        "Allocate even when the memory planner says this machine cannot hold the config");
  if (argc > 1) {
    const std::string unknown = unknown_command(app, argv[1]);
    if (!unknown.empty()) {
      std::fputs(unknown.c_str(), stderr);
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
  }
  std::vector<char*> own = own_arguments(argc, argv, launch);
  try {
    app.parse(int(own.size()), own.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  harness::set_ignore_memory_plan(ignore_memory_plan);
  try {
    for (auto& [sub, run] : subs.actions)
      if (*sub) return run();
  } catch (const dist::DistError& e) {
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
