#include "dist/split_loop.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "core/device.h"
#include "core/init.h"
#include "core/safetensors.h"
#include "core/signals.h"
#include "fixtures/fixtures.h"
#include "optimized/step.h"
#include "optimized/target.h"
#include "reference/step.h"
#include "reference/target.h"

namespace dflash::dist {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StepFn step_fn(const std::string& build) {
  return build == "reference" ? StepFn(reference::drafter_step) : StepFn(optimized::drafter_step);
}

void maybe_fault(const std::string& spec, int64_t rank, int64_t step) {
  if (spec.empty()) return;
  int64_t r = -1, t = -1;
  char mode[16] = {0};
  if (std::sscanf(spec.c_str(), "rank=%ld,step=%ld,mode=%15s", &r, &t, mode) != 3) return;
  if (r != rank || t != step) return;
  fmt::print(stderr, "rank {}: injected fault '{}' at step {}\n", rank, mode, step);
  std::fflush(stderr);
  if (std::string(mode) == "hang") std::raise(SIGSTOP);
  std::_Exit(17);
}

// One micro-batch: forward, and backward of the unnormalised numerator
// (loss x local weight sum), so that sums over micro-batches and ranks can
// be divided once by the global weight sum.
struct MicroResult {
  double num, den, accept, kept;
};
MicroResult micro_step(const StepFn& fn, const Config& c, const DrafterWeights& w,
                       const FrozenWeights& f, const StepInputs& in, bool per_rank) {
  const StepOutputs out = fn(c, w, f, in);
  const double den = out.weight_sum.item<double>();
  if (per_rank)
    out.loss.backward();  // the bug: normalised by this rank alone
  else
    (out.loss * den).backward();
  return {out.loss.item<double>() * den, den, double(out.accept_sum.item<int64_t>()),
          double(out.kept_blocks.item<int64_t>())};
}

StepLog log_line(int64_t t, double num, double den, const AdamW::Stats& s, double accept,
                 double kept, double wait, double secs, bool print) {
  const StepLog l{t,    den > 0 ? num / den : 0.0,
                  den,  s.grad_norm,
                  s.lr, kept > 0 ? 1.0 + accept / kept : 1.0,
                  wait, secs};
  if (!print) return l;
  fmt::print(
      "step {:>4}  loss {:.8f}  tau {:.3f}  weight {:.3f}  grad_norm {:.4e}  lr {:.3e}  "
      "wait {:.3f}s / {:.3f}s\n",
      l.step, l.loss, l.tau, l.weight_sum, l.grad_norm, l.lr, l.wait_seconds, l.step_seconds);
  std::fflush(stdout);
  return l;
}

}  // namespace

namespace {

StepInputs fixture_micro_batch(const Config& c, const TargetWeights& target, int64_t g) {
  const fixtures::Batch b = fixtures::make_batch(c, uint64_t(g));
  const reference::TargetOutputs tout = optimized::target_forward(c, target, b.input_ids);
  return {b.input_ids, b.loss_mask, tout.features, tout.final_hidden, {}};
}

// Target rank: build, run and send every micro-batch assigned to it, from
// the resumed step on; with stop_on_signal, until the drafters announce a
// stop (then it publishes that it sends no more and waits for the drafters
// to take what it has sent). Returns the signal it stopped on, or 0.
int run_target_rank(const Config& c, const TrainOptions& o, dist::Cluster& cl, int64_t D) {
  std::function<StepInputs(int64_t)> make = o.hooks.micro_batch;
  if (!make) {
    auto target = std::make_shared<TargetWeights>(make_target(c));
    make = [&c, target](int64_t g) { return fixture_micro_batch(c, *target, g); };
  }
  const size_t depth = size_t(c.topology.queue_depth) * 4;  // four tensors per micro-batch
  const int64_t T = cl.num_targets(), first = o.hooks.start_step * D;
  const int64_t g0 = first + ((cl.target_index() - first) % T + T) % T;
  int stop = 0;
  int64_t sent = -1;
  for (int64_t g = g0; g < o.steps * D; g += T) {
    if (o.stop_on_signal && (stop = cl.stop_announced()) != 0) break;
    maybe_fault(o.fault, cl.rank(), g / D);
    const StepInputs in = make(g);
    const int64_t dst = cl.drafter_rank(g % D);
    const std::vector<at::Tensor> parts = {in.input_ids, in.loss_mask.to(at::kByte),
                                           in.features.contiguous(), in.target_hidden.contiguous()};
    for (int i = 0; i < 4; ++i)
      cl.isend({parts[size_t(i)]}, dst, int(g * 4 + i), depth,
               fmt::format("micro-batch {} for drafter rank {}", g, dst));
    if (o.stop_on_signal) cl.publish_sent(sent = g, false);
  }
  if (o.stop_on_signal) cl.publish_sent(sent, true);
  cl.wait_sends(0, "the last micro-batches");
  if (stop != 0)
    fmt::print("target rank {}: stopped by {} with the drafters; last micro-batch sent: {}\n",
               cl.rank(), stop == SIGINT ? "SIGINT" : "SIGTERM", sent);
  return stop;
}

StepInputs receive_micro_batch(const Config& c, dist::Cluster& cl, int64_t g, int64_t src,
                               const c10::Device& device) {
  const int64_t B = c.data.batch_size, S = c.data.seq_len, H = c.target.shape.hidden_size;
  const at::ScalarType dt = scalar_type(c.run.dtype);
  std::vector<at::Tensor> ids{at::empty({B, S}, at::kLong)}, mask{at::empty({B, S}, at::kByte)},
      feats{at::empty({B, S, c.num_taps() * H}, dt)}, hidden{at::empty({B, S, H}, dt)};
  const std::string what = fmt::format("micro-batch {} from target rank {}", g, src);
  cl.recv(ids, src, int(g * 4), what);
  cl.recv(mask, src, int(g * 4 + 1), what);
  cl.recv(feats, src, int(g * 4 + 2), what);
  cl.recv(hidden, src, int(g * 4 + 3), what);
  StepInputs in{ids[0], mask[0].to(at::kBool), feats[0], hidden[0], {}};
  in.anchors = step_anchors(c, in.loss_mask, "anchors", uint64_t(g));
  return to_device(in, device);
}

// Without target ranks (data.source = "features"): the drafter reads its
// micro-batch g itself, anchors drawn as a received one's.
StepInputs local_micro_batch(const Config& c, const TrainOptions& o, int64_t g,
                             const c10::Device& device) {
  StepInputs in = o.hooks.micro_batch(g);
  in.anchors = step_anchors(c, in.loss_mask, "anchors", uint64_t(g));
  return to_device(in, device);
}

// Runs `collective` on the tensors flattened into buckets of about 25 MB
// (gloo wants equally shaped tensors per call), copying the results back.
void bucketed(std::vector<at::Tensor>& tensors,
              const std::function<void(std::vector<at::Tensor>&)>& collective) {
  const size_t bucket_bytes = 25u << 20;
  for (size_t i = 0; i < tensors.size();) {
    std::vector<at::Tensor> flat;
    size_t bytes = 0, j = i;
    for (; j < tensors.size() && (bytes == 0 || bytes + tensors[j].nbytes() <= bucket_bytes); ++j)
      flat.push_back(tensors[j].reshape(-1)), bytes += tensors[j].nbytes();
    std::vector<at::Tensor> bucket{at::cat(flat)};
    collective(bucket);
    int64_t off = 0;
    for (size_t k = i; k < j; ++k) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(bucket[0].narrow(0, off, n).view_as(tensors[k]));
      off += n;
    }
    i = j;
  }
}

// Gradients, then the [numerator, weight sum, accepted, kept] sums, summed
// over the drafter ranks.
void allreduce_step(dist::Cluster& cl, const DrafterWeights& w, at::Tensor& sums) {
  std::vector<at::Tensor> grads;
  for (auto& [n, p] : named(w)) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad());
  }
  bucketed(grads,
           [&](std::vector<at::Tensor>& b) { cl.allreduce_drafters(b, "gradient all-reduce"); });
  std::vector<at::Tensor> s{sums};
  cl.allreduce_drafters(s, "loss numerator and weight-sum all-reduce");
}

}  // namespace

namespace {

void broadcast_parameters(dist::Cluster& cl, const DrafterWeights& w) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> params;
  for (auto& [n, p] : named(w)) params.push_back(p.detach());
  bucketed(params,
           [&](std::vector<at::Tensor>& b) { cl.broadcast_drafters(b, "initial parameters"); });
}

bool finite_step(const MicroResult& m, const DrafterWeights& w) {
  if (!std::isfinite(m.num)) return false;
  for (auto& [n, p] : named(w))
    if (p.grad().defined() && !at::isfinite(p.grad()).all().item<bool>()) return false;
  return true;
}

// After the drafters agreed to stop after step S - 1: the micro-batches the
// target ranks already sent (at most queue_depth each) are received and
// dropped, in order, until every target rank that sends to this drafter has
// said it sends no more, so that no target waits on its sends until the
// timeout. Sources repeat every T steps: T skips in a row end the drain.
void drain_after_stop(const Config& c, const TrainOptions& o, dist::Cluster& cl, int64_t D,
                      int64_t S, const c10::Device& device) {
  const int64_t T = cl.num_targets();
  int64_t skipped = 0;
  for (int64_t s = S; s < o.steps && skipped < T; ++s) {
    const int64_t g = s * D + cl.drafter_index(), src = g % T;
    const double deadline = now() + c.topology.timeout_s;
    for (;;) {
      const auto [sent, done] = cl.sent_by(src);
      if (sent >= g) {
        receive_micro_batch(c, cl, g, cl.target_rank(src), device);
        skipped = 0;
        break;
      }
      if (done) {
        ++skipped;
        break;
      }
      if (now() > deadline)
        cl.fail(fmt::format("draining micro-batch {} after the stop", g),
                std::runtime_error("target rank " + std::to_string(cl.target_rank(src)) +
                                   " neither sent it nor stopped"));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

// The signal the drafters agreed to stop on, from the step's sums (every
// drafter adds whether it was asked to stop, and whether by SIGINT): the
// same on every drafter rank.
int agreed_stop(const at::Tensor& sums) {
  if (sums[5].item<double>() == 0) return 0;
  return sums[6].item<double>() > 0 ? SIGINT : SIGTERM;
}

// Every drafter after the agreed step S - 1: rank 0 announces the stop to the
// target ranks and checkpoints; all drain what the targets already sent.
void stop_drafter(const Config& c, const TrainOptions& o, dist::Cluster& cl, int64_t D, int64_t S,
                  int sig, const DrafterWeights& w, const AdamW& opt, const c10::Device& device) {
  if (cl.drafter_index() == 0) {
    cl.announce_stop(sig);
    if (o.hooks.at_stop) o.hooks.at_stop(w, opt, sig);
  }
  drain_after_stop(c, o, cl, D, S, device);
}

// Drafter rank: receive, step, all-reduce, update; rank 0 reports. Returns
// the signal the drafters stopped on, or 0.
int train_drafter_rank(const Config& c, const TrainOptions& o, dist::Cluster& cl, int64_t D,
                       std::vector<StepLog>& log) {
  const c10::Device device = config_device(c);  // cuda: cuda:LOCAL_RANK
  DrafterWeights w = make_drafter(c);
  to_device(w, device);
  AdamW opt(named(w), o.optim);
  if (o.hooks.resume) o.hooks.resume(w, opt);
  broadcast_parameters(cl, w);
  if (cl.drafter_index() == 0 && o.hooks.at_start) o.hooks.at_start();
  FrozenWeights frozen = o.hooks.frozen ? o.hooks.frozen() : make_target(c).frozen();
  to_device(frozen, device);
  const StepFn fn = step_fn(o.build);
  const bool reporter = cl.drafter_index() == 0;
  for (int64_t t = o.hooks.start_step; t < o.steps; ++t) {
    maybe_fault(o.fault, cl.rank(), t);
    const double t0 = now();
    const int64_t g = t * D + cl.drafter_index();
    const StepInputs in =
        cl.num_targets() == 0
            ? local_micro_batch(c, o, g, device)
            : receive_micro_batch(c, cl, g, cl.target_rank(g % cl.num_targets()), device);
    const double waited = now() - t0;
    zero_grads(w);
    if (o.hooks.before_step) o.hooks.before_step(t, w);
    const MicroResult m = micro_step(fn, c, w, frozen, in, o.per_rank_normalisation);
    const bool bad = !finite_step(m, w);
    const int asked = o.stop_on_signal ? stop_requested() : 0;
    at::Tensor sums = at::tensor({m.num, m.den, m.accept, m.kept, bad ? 1.0 : 0.0,
                                  asked != 0 ? 1.0 : 0.0, asked == SIGINT ? 1.0 : 0.0},
                                 at::kDouble);
    allreduce_step(cl, w, sums);
    if (sums[4].item<double>() > 0) {  // every drafter sees it: all stop, the culprits dump
      if (bad && o.hooks.nonfinite) o.hooks.nonfinite(t, g, in, w);
      throw dist::DistError(fmt::format(
          "rank {}: non-finite loss or gradient at step {} on {} drafter rank(s); stopping",
          cl.rank(), t + 1, int64_t(sums[4].item<double>())));
    }
    const double num = sums[0].item<double>(), den = sums[1].item<double>();
    scale_grads(w, o.per_rank_normalisation ? double(D) : den);
    const AdamW::Stats s = opt.step();
    if (reporter) {
      log.push_back(log_line(t, num, den, s, sums[2].item<double>(), sums[3].item<double>(), waited,
                             now() - t0, !o.hooks.after_step));
      if (o.hooks.after_step) o.hooks.after_step(log.back(), w, opt);
    }
    if (const int sig = agreed_stop(sums); sig != 0 && t + 1 < o.steps) {
      stop_drafter(c, o, cl, D, t + 1, sig, w, opt, device);
      return sig;
    }
  }
  if (!reporter) return 0;
  write_params(o.out_params, w);
  if (o.hooks.at_end) o.hooks.at_end(w, opt);
  return 0;
}

}  // namespace

std::vector<StepLog> train_distributed(const Config& c, const TrainOptions& o, dist::Cluster& cl,
                                       int* stopped) {
  const int64_t D = cl.num_drafters();
  if (o.micro_batches > 0 && o.micro_batches != D)
    throw dist::DistError(
        fmt::format("--micro-batches {} but the topology has {} drafter ranks "
                    "(one micro-batch per drafter per step)",
                    o.micro_batches, D));
  if (cl.num_targets() == 0 && !o.hooks.micro_batch)
    throw dist::DistError(
        "no target ranks: every drafter rank must read its own micro-batches (data.source = "
        "\"features\")");
  std::vector<StepLog> log;
  int sig = 0;
  if (cl.is_target()) sig = run_target_rank(c, o, cl, D);
  if (cl.is_drafter()) sig = train_drafter_rank(c, o, cl, D, log);
  // After a stop too: no rank exits before drafter rank 0's checkpoint is complete.
  cl.barrier_world(sig != 0 ? "the stop" : "the end of training");
  if (stopped) *stopped = sig;
  return log;
}

int run_train(const Config& c, const TrainOptions& o) {
  activate_device(config_device(c), c.path + ": topology.device");
  const dist::Env env = dist::env_from_process();
  if (!env.present || env.world_size == 1)
    throw dist::DistError("the split needs RANK / WORLD_SIZE > 1 (dflash launch or torchrun)");
  Config local = c;
  if (const char* r = std::getenv("DFLASH_TEST_PERTURB_CONFIG_RANK"))  // test hook
    if (std::atoll(r) == env.rank) local.loss.gamma += 1.0;
  dist::Cluster cl(local, env);
  int sig = 0;
  train_distributed(local, o, cl, &sig);
  return sig != 0 ? 128 + sig : 0;
}

}  // namespace dflash::dist
