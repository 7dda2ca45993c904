// The single-process training loop; see loop.h.
#include "train/loop.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/init.h"
#include "core/optim.h"
#include "core/safetensors.h"
#include "core/signals.h"
#include "core/step.h"
#include "data/data.h"
#include "decode/export.h"
#include "decode/served_eval.h"
#include "dist/split_loop.h"
#include "harness/memory_guard.h"
#include "harness/preflight.h"
#include "harness/step_dump.h"
#include "models/checkpoint.h"
#include "models/hf.h"
#include "optimized/step.h"
#include "optimized/target.h"
#include "reference/step.h"
#include "reference/target.h"
#include "train/report.h"
#include "train/run_state.h"
#include "train/samples.h"

namespace dflash::train {
namespace fs = std::filesystem;
namespace detail {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StepInputs inputs_of(const Run& r, const data::MicroBatch& mb, const char* stream, int64_t index) {
  StepInputs in{mb.input_ids, mb.loss_mask, mb.features, mb.target_hidden, {}};
  // Anchors are drawn on the host (a seeded stream per micro-batch), then the
  // batch moves to the run's device, where the target runs.
  in.anchors = step_anchors(r.c, in.loss_mask, stream, uint64_t(index));
  in = to_device(in, r.device);
  if (!in.features.defined()) {
    const reference::TargetOutputs t = optimized::target_forward(r.c, r.target, in.input_ids);
    in.features = t.features, in.target_hidden = t.final_hidden;
  }
  return in;
}

bool finite(const at::Tensor& t) {
  return !t.defined() || !t.is_floating_point() || at::isfinite(t).all().item<bool>();
}

// Stops the run: dumps the step (replayable with dflash step --from) and
// names the first non-finite tensor, inputs first, then parameters, loss,
// gradients.
[[noreturn]] void stop_nonfinite(const Run& r, const StepInputs& in, int64_t g) {
  const std::string dump = (fs::path(r.dir) / fmt::format("nonfinite-step-{:06d}{}.safetensors",
                                                          r.st.step + 1, r.dump_suffix))
                               .string();
  fs::create_directories(r.dir);
  const StepResult res = run_step(r.fn, r.c, r.w, r.frozen, in);
  harness::write_step_dump(dump, r.c, r.w, r.frozen, in, res);
  std::string first = "none found on replay";
  NamedTensors order = {{"input.features", in.features}, {"input.target_hidden", in.target_hidden}};
  for (auto& p : named(r.w)) order.push_back(p);
  order.emplace_back("output.loss", res.out.loss);
  for (auto& [n, t] : res.grads) order.emplace_back("grad." + n, t);
  for (auto& [n, t] : order)
    if (!finite(t)) {
      first = n;
      break;
    }
  throw std::runtime_error(fmt::format(
      "non-finite loss or gradient at step {} (micro-batch {}): first non-finite tensor: {}; "
      "step dump: {} (replay: dflash step --from {})",
      r.st.step + 1, g, first, dump, dump));
}

void check_gradients(const Run& r, const StepInputs& in, int64_t g) {
  for (auto& [n, p] : named(r.w))
    if (!finite(p.grad())) stop_nonfinite(r, in, g);
}

void append_metrics(Run& r, const nlohmann::json& j) {
  r.metrics << j.dump() << "\n";
  r.metrics.flush();
  if (r.tensorboard) {
    write_metrics_row(*r.tensorboard, j);
    r.tensorboard->flush();
  }
}

Sums evaluate(Run& r) {
  Sums s;
  for (int64_t i = 0; i < r.c.train.eval_batches; ++i) {
    const StepInputs in = inputs_of(r, data::eval_batch(r.c, r.data.eval, i), "eval_anchors", i);
    at::NoGradGuard ng;
    s.add(r.fn(r.c, r.w, r.frozen, in));
  }
  const std::vector<double> acc = s.accuracy();
  // Slot 0 is the given anchor (never predicted, always 0): slots 1..bs-1 only.
  fmt::print("eval @ {}: loss {:.6f}  tau {:.3f}  accuracy of slots 1-{} [{:.3f}]\n", r.st.step,
             s.loss(), s.tau(), acc.size() - 1,
             fmt::join(acc.begin() + std::min<size_t>(1, acc.size()), acc.end(), ", "));
  append_metrics(r, {{"kind", "eval"},
                     {"step", r.st.step},
                     {"loss", s.loss()},
                     {"tau", s.tau()},
                     {"accuracy", acc}});
  return s;
}

void served_evaluate(Run& r) {
  const TrainConfig& tc = r.c.train;
  if (tc.served_eval_prompts == 0 || !r.target.embed_tokens.defined() || !has_eval(r)) return;
  const std::vector<std::vector<int64_t>> prompts =
      decode::served_prompts(r.c, r.data.eval, tc.served_eval_prompts);
  decode::ServedOptions so;
  so.block_size = r.c.data.block_size;
  so.max_new_tokens = tc.served_eval_tokens;
  so.max_context = decode::context_limit(r.c);
  so.budgets = {tc.served_tree_budget};
  so.plain_greedy = false;  // acceptance only; `dflash eval` times the speedup
  const decode::ServedReport rep = decode::served_eval({&r.c, &r.target, &r.w, r.fn}, prompts, so);
  r.served = rep.block.acceptance(), r.served_tree = rep.trees[0].acceptance();
  fmt::print(
      "served @ {}: acceptance {:.3f}  tree {} {:.3f}  (tau on the same texts {:.3f}; {} "
      "prompts x {} tokens)\n",
      r.st.step, r.served, tc.served_tree_budget, r.served_tree, rep.tau, prompts.size(),
      tc.served_eval_tokens);
  nlohmann::json j = rep.to_json();
  append_metrics(r, {{"kind", "served"},
                     {"step", r.st.step},
                     {"acceptance", r.served},
                     {"tree_budget", tc.served_tree_budget},
                     {"tree_acceptance", r.served_tree},
                     {"tau_same_texts", rep.tau},
                     {"histogram", j["block"]["histogram"]},
                     {"acceptance_by_position", j["block"]["acceptance_by_position"]},
                     {"mismatched_prompts", rep.mismatches()}});
}

bool has_eval(const Run& r) {
  return r.data.eval.size() > 0 || r.c.data.source == "fixture" || r.c.data.source == "inline";
}

// Test hook: DFLASH_TEST_SIGNAL_IN_STEP=<step>[,int] raises SIGTERM (SIGINT)
// in the middle of that step (1-based), after its first micro-batch.
void maybe_signal_in_step(int64_t step) {
  const char* s = std::getenv("DFLASH_TEST_SIGNAL_IN_STEP");
  if (!s || std::atoll(s) != step) return;
  std::raise(std::string(s).find(",int") != std::string::npos ? SIGINT : SIGTERM);
}

// One optimizer step: D micro-batches, global normalisation, clip + AdamW.
Sums train_step(Run& r) {
  const int64_t D = r.c.train.micro_batches;
  zero_grads(r.w);
  if (r.o.poison_step == r.st.step + 1) {
    at::NoGradGuard ng;
    r.w.fc.view(-1)[0] = NAN;
  }
  Sums s;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t g = r.st.cursor++;
    const StepInputs in = inputs_of(r, data::train_batch(r.c, r.data.train, g), "anchors", g);
    const StepOutputs out = r.fn(r.c, r.w, r.frozen, in);
    if (!std::isfinite(out.loss.item<double>())) stop_nonfinite(r, in, g);
    (out.loss * out.weight_sum.item<double>()).backward();  // numerator; divided below
    check_gradients(r, in, g);
    s.add(out);
    if (d == 0) maybe_signal_in_step(r.st.step + 1);
  }
  scale_grads(r.w, s.den);
  return s;
}

std::string eta_text(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60)
                   : fmt::format("{}m{:02d}s", s / 60, s % 60);
}

void progress(Run& r, const Sums& s, const AdamW::Stats& st, double step_s, double mean_s) {
  const int64_t left = r.c.train.steps - r.st.step;
  append_metrics(r, {{"kind", "train"},
                     {"step", r.st.step},
                     {"loss", s.loss()},
                     {"ce", s.per_weight(s.ce)},
                     {"kl", s.per_weight(s.kl)},
                     {"reverse_kl", s.per_weight(s.reverse_kl)},
                     {"jsd", s.per_weight(s.jsd)},
                     {"tv", s.per_weight(s.tv)},
                     {"tau", s.tau()},
                     {"weight_sum", s.den},
                     {"grad_norm", st.grad_norm},
                     {"lr", st.lr},
                     {"tokens_per_s", r.tokens_per_step / step_s},
                     {"step_s", step_s}});
  if (!line_due(r)) return;
  const std::string served = r.served > 0 ? fmt::format("  served {:.3f}", r.served) : "";
  fmt::print(
      "step {:>5}  loss {:.8f}  tau {:.3f}{}  lr {:.3e}  grad_norm {:.3e}  {:.0f} tok/s  ETA {}\n",
      r.st.step, s.loss(), s.tau(), served, st.lr, st.grad_norm, r.tokens_per_step / mean_s,
      eta_text(mean_s * double(left)));
  std::fflush(stdout);
}

bool line_due(const Run& r) {
  return r.st.step % r.c.train.log_every == 0 || r.st.step == 1 || r.st.step == r.c.train.steps;
}

void maybe_exit_after(int64_t step) {  // test hook: a kill between steps
  const char* s = std::getenv("DFLASH_TEST_EXIT_AFTER_STEP");
  if (s && std::atoll(s) == step) {
    fmt::print(stderr, "test hook: exiting after step {}\n", step);
    std::_Exit(9);
  }
}

}  // namespace detail
}  // namespace dflash::train

namespace dflash::train {
namespace detail {

std::string run_dir_for(const Config& c, const RunOptions& o) {
  if (!o.out_dir.empty()) return o.out_dir;
  if (!c.train.out_dir.empty()) return c.train.out_dir;
  return (fs::path("runs") / fs::path(o.config).stem()).string();
}

// --resume: the newest intact checkpoint (newer damaged ones are named and,
// once the run starts writing, set aside), checked against the config.
void resume_from_checkpoint(Run& r) {
  models::ResumePoint rp = models::newest_intact_checkpoint(r.dir);
  if (!rp.ck) {
    fmt::print("resume: no complete checkpoint in {}; starting at step 0\n", r.dir);
    return;
  }
  const models::Checkpoint& ck = *rp.ck;
  for (size_t i = 0; i < rp.damaged_dirs.size(); ++i)
    fmt::print(stderr,
               "warning: {} is damaged ({}); resuming from the newest intact checkpoint, {}; "
               "the damaged one will be set aside as damaged-*\n",
               rp.damaged_dirs[i], rp.damaged_reasons[i], ck.dir);
  r.damaged = rp.damaged_dirs;
  const std::vector<std::string> changed = models::check_same_run(ck, r.c);
  models::restore(ck, r.c, r.w, *r.opt);
  r.st = ck.state;
  r.resumed = true;
  if (ck.threads != 0 && ck.threads != at::get_num_threads())
    fmt::print(stderr,
               "warning: {} was written with {} intra-op threads, this run has {}: CPU "
               "reductions split differently, so the resumed run is not bit-exact (run.threads "
               "fixes the count)\n",
               ck.dir, ck.threads, at::get_num_threads());
  fmt::print("resuming from {} (step {}, data cursor {})\n", ck.dir, r.st.step, r.st.cursor);
  for (const std::string& k : changed) fmt::print("resume: {} (changed since the checkpoint)\n", k);
  if (!changed.empty())
    fmt::print("resume: the learning-rate schedule continues from step {} with these values\n",
               r.st.step);
}

// Everything that can reject the run's inputs, read-only: nothing in the
// run directory is written before this has passed.
std::unique_ptr<Run> prepare(const Config& c, const RunOptions& o, bool with_data,
                             bool with_target) {
  auto r = std::make_unique<Run>();
  r->c = c, r->o = o, r->dir = run_dir_for(c, o);
  r->device = config_device(c);
  activate_device(r->device, c.path + ": topology.device");
  if (c.data.source == "features") {
    r->frozen = data::read_features_frozen(c, c.data.path);
  } else if (with_target) {
    r->target = models::load_target(c);
    to_device(r->target, r->device);
    r->frozen = r->target.frozen();
  } else {
    r->frozen = models::load_frozen(c);
  }
  to_device(r->frozen, r->device);
  if (with_data) {
    r->data = data::load_data(c, c.data.source == "features" ? nullptr : &r->target);
    if (r->data.train.size() > 0)
      fmt::print("data: {} training samples from {}; {} held out from {}\n", r->data.train.size(),
                 r->data.train.label, r->data.eval.size(),
                 r->data.eval.size() > 0 ? r->data.eval.label : std::string("nothing"));
  }
  r->w = make_drafter(c);
  to_device(r->w, r->device);  // before AdamW: its moments are made beside the parameters
  if (!o.init_from.empty()) {  // a resumed checkpoint, when there is one, overrides it
    const decode::DrafterDir d = decode::read_drafter_dir(o.init_from);
    decode::init_from_drafter(d, c, r->w);
    fmt::print("init: the drafter starts from {} ({} layout; checked against the config)\n",
               o.init_from, d.layout);
  }
  r->opt = std::make_unique<AdamW>(named(r->w), optim_config(c.train));
  r->fn =
      o.build == "reference" ? StepFn(reference::drafter_step) : StepFn(optimized::drafter_step);
  r->tokens_per_step = double(c.data.batch_size * c.data.seq_len * c.train.micro_batches);
  const auto latest = models::latest_checkpoint(r->dir);
  if (latest && !o.resume)
    throw std::runtime_error(fmt::format(
        "{} already holds checkpoints ({}); pass --resume to continue that run or --out-dir "
        "for a new one; nothing was overwritten",
        r->dir, *latest));
  if (o.resume) resume_from_checkpoint(*r);
  return r;
}

// metrics.jsonl keeps what happened up to the resumed step.
void open_metrics(Run& r) {
  const fs::path file = fs::path(r.dir) / "metrics.jsonl";
  std::string kept;
  if (r.st.step > 0 && fs::exists(file)) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("step", int64_t(-1)) <= r.st.step) kept += line + "\n";
    }
  }
  safetensors::write_file_atomic(file.string(), kept);
  r.metrics.open(file, std::ios::app);
  // A resumed run adds an event file; TensorBoard drops the older files'
  // events past the step the run went back to (its step goes backwards).
  if (r.c.train.report_to == "tensorboard")
    r.tensorboard = std::make_unique<TensorBoardWriter>(r.dir);
}

double begin_run(Run& r) {
  fs::create_directories(r.dir);
  for (const std::string& d : r.damaged)  // a new checkpoint of that step must not meet it
    fmt::print(stderr, "set aside the damaged checkpoint {} as {}\n", d,
               models::set_aside_damaged(d));
  r.damaged.clear();
  safetensors::write_file_atomic((fs::path(r.dir) / "config.toml").string(), config_to_toml(r.c));
  open_metrics(r);
  if (r.st.step != 0 || !has_eval(r)) return 0.0;
  const double tau = evaluate(r).tau();
  served_evaluate(r);
  return tau;
}

bool after_step(Run& r, const AdamW& opt) {
  const TrainConfig& tc = r.c.train;
  const bool last = r.st.step == tc.steps,
             saving = tc.checkpoint_every > 0 && r.st.step % tc.checkpoint_every == 0;
  if (!last && tc.eval_every > 0 && r.st.step % tc.eval_every == 0 && has_eval(r)) evaluate(r);
  if (!last && tc.served_eval_every > 0 && r.st.step % tc.served_eval_every == 0)
    served_evaluate(r);
  if (saving) fmt::print("checkpoint: {}\n", models::save_checkpoint(r.dir, r.c, r.w, opt, r.st));
  maybe_exit_after(r.st.step);
  return saving;
}

std::pair<double, std::string> end_run(Run& r, const AdamW& opt, bool saved_now) {
  const double tau = has_eval(r) ? evaluate(r).tau() : 0.0;
  served_evaluate(r);
  if (!saved_now)
    fmt::print("checkpoint: {}\n", models::save_checkpoint(r.dir, r.c, r.w, opt, r.st));
  r.metrics.close();
  if (r.data.eval.size() > 0) {
    const SampleSource src{&r.c, r.fn, &r.w, &r.frozen, &r.target, r.device};
    safetensors::write_file_atomic((fs::path(r.dir) / "samples.json").string(),
                                   draft_samples(src, r.data.eval, 4, 6).dump() + "\n");
  }
  return {tau, write_report(r.dir)};
}

// A stop signal between steps: the step just done is checkpointed (unless
// it was already), and the run ends without its final evaluation.
void stop_for_signal(Run& r, const AdamW& opt, bool saved_now, int sig, RunSummary& sum) {
  const std::string ck =
      saved_now ? (fs::path(r.dir) / "checkpoints" / fmt::format("step-{:06d}", r.st.step)).string()
                : models::save_checkpoint(r.dir, r.c, r.w, opt, r.st);
  r.metrics.close();
  sum.signal = sig;
  fmt::print(stderr,
             "\ndflash train: stopped by {} after step {} of {}; checkpoint {} is complete.\n"
             "Continue the run with the same command and --resume:\n"
             "  dflash train --config {} --out-dir {} --resume\n",
             sig == SIGINT ? "SIGINT" : "SIGTERM", r.st.step, r.c.train.steps, ck, r.o.config,
             r.dir);
  std::fflush(stderr);
}

RunSummary run_loop(Run& r) {
  RunSummary sum{r.dir, "", r.c.train.steps, 0, 0};
  sum.first_eval_tau = begin_run(r);
  sum.first_served = r.served;
  double spent = 0;
  int64_t timed = 0;
  bool saved = false;
  while (r.st.step < r.c.train.steps) {
    if (const int sig = stop_requested()) {
      stop_for_signal(r, *r.opt, saved, sig, sum);
      return sum;
    }
    const double t0 = now();
    const Sums s = train_step(r);
    const AdamW::Stats st = r.opt->step();
    ++r.st.step;
    const double dt = now() - t0;
    spent += dt, ++timed;
    progress(r, s, st, dt, spent / double(timed));
    saved = after_step(r, *r.opt);
  }
  write_params(r.o.out_params, r.w);
  std::tie(sum.last_eval_tau, sum.report) = end_run(r, *r.opt, saved);
  sum.last_served = r.served;
  return sum;
}

// Preflight first; its verdict goes beside the run. Returns false when the
// run must not start.
bool gate(const Config& c, const RunOptions& o, const std::string& dir) {
  const fs::path verdict =
      fs::temp_directory_path() / fmt::format("dflash-preflight-{}.json", ::getpid());
  if (o.skip_preflight) {
    fmt::print(stderr,
               "\n*** WARNING: --skip-preflight: NOT checking this config before training. ***\n"
               "*** Skipped: gradient parity of the optimized step against the reference, the\n"
               "*** requires_grad / frozen-weight audit, the memory ceilings of the fused loss\n"
               "*** and sparse attention, the full-scale memory plan and the real-step check.\n\n");
    safetensors::write_file_atomic(verdict.string(),
                                   nlohmann::json({{"config", c.path},
                                                   {"passed", nullptr},
                                                   {"skipped", true},
                                                   {"checks", nlohmann::json::array()}})
                                           .dump(2) +
                                       "\n");
  } else {
    harness::PreflightOptions p;
    p.config = o.config;
    p.set = o.set;
    p.json = verdict.string();
    p.cases = o.preflight_cases;
    p.out_dir = dir;
    p.device = o.device;  // --device: the twin runs where the run will
    if (harness::run_preflight(p) != 0) {
      fmt::print(stderr,
                 "dflash train: preflight FAILED (table above); not training. Fix the config "
                 "or, knowingly, pass --skip-preflight.\n");
      fs::remove(verdict);
      return false;
    }
  }
  fs::create_directories(dir);
  fs::copy_file(verdict, fs::path(dir) / "preflight.json", fs::copy_options::overwrite_existing);
  fs::remove(verdict);
  return true;
}

}  // namespace detail

Config resolve_config(const RunOptions& o) {
  Config c = load_config(o.config, o.set);
  if (o.steps > 0) c.train.steps = o.steps;
  if (o.micro_batches > 0) c.train.micro_batches = o.micro_batches;
  if (o.lr > 0) c.train.lr = o.lr;
  if (!o.out_dir.empty()) c.train.out_dir = o.out_dir;
  if (!o.device.empty()) c.topology.device = o.device;
  validate_config(c);
  return c;
}

RunSummary train_run(const Config& c, const RunOptions& o) {
  configure_threads(c.run.threads);
  std::unique_ptr<detail::Run> r = detail::prepare(c, o, true, true);
  return detail::run_loop(*r);
}

int run_training(const RunOptions& o) {
  const char* ws = std::getenv("WORLD_SIZE");
  const Config c = resolve_config(o);
  harness::guard_memory(c, harness::Workload::kTrain, "dflash train");
  configure_threads(c.run.threads);
  if (ws && std::atoll(ws) > 1) return detail::run_split(c, o);
  configure_threads(c.run.threads);
  // Every input is checked before anything is written.
  std::unique_ptr<detail::Run> r = detail::prepare(c, o, true, true);
  if (!detail::gate(c, o, r->dir)) return 1;
  install_stop_handlers();  // SIGTERM / SIGINT: checkpoint, then exit 128 + signal
  const RunSummary s = detail::run_loop(*r);
  if (s.signal != 0) return 128 + s.signal;
  if (r->resumed)
    fmt::print("\ntrained to step {} (resumed); held-out tau {:.3f}\nreport: {}\n", s.steps,
               s.last_eval_tau, s.report);
  else
    fmt::print("\ntrained {} steps; held-out tau {:.3f} -> {:.3f}{}\nreport: {}\n", s.steps,
               s.first_eval_tau, s.last_eval_tau,
               s.last_served > 0 ? fmt::format("; served acceptance {:.3f} -> {:.3f}",
                                               s.first_served, s.last_served)
                                 : std::string(),
               s.report);
  return 0;
}

}  // namespace dflash::train
