// Several steps of the real training loop (train::detail::run_loop, two
// micro-batches per step, float64) against a loop written here from
// SPEC.md steps 9 and 11: per step, one loss = (sum over micro-batches of the
// weighted CE and KL numerators) / (sum of their weights), one backward, one
// AdamW update. The parameters after four steps must agree (1e-10), every
// trainable parameter must have moved, and the frozen embedding, LM head and
// target must be bit-identical to a fresh load and never hold a gradient.
// Catches what a one-step parity check cannot: normalisation per
// micro-batch, gradients carried over between steps, a frozen weight that
// moves.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/weights.h"
#include "data/data.h"
#include "reference/step.h"
#include "train/loop.h"
#include "train/run_state.h"

namespace dflash::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig =
    "[target]\nvocab_size = 48\nhidden_size = 16\nnum_hidden_layers = 3\n"
    "num_attention_heads = 4\nnum_key_value_heads = 2\nhead_dim = 8\nintermediate_size = 24\n"
    "init_std = 0.2\n[drafter]\nnum_hidden_layers = 2\ntarget_layer_ids = [0, 1]\n"
    "init_std = 0.2\n[data]\nsource = \"self_distill\"\nnum_samples = 16\neval_samples = 4\n"
    "prompt_len = 4\nbatch_size = 3\nseq_len = 16\nblock_size = 4\nmax_anchors = 3\n"
    "mask_token_id = 47\n[loss]\nkl_weight = 0.5\ngamma = 2.0\nchunk_size = 5\n[run]\nseed = 9\n"
    "threads = 1\ndtype = \"float64\"\n[optimized]\ncheckpoint_layers = true\nattention_tile = 5\n"
    "[train]\nsteps = 4\nmicro_batches = 2\nlr = 2e-2\nwarmup_steps = 1\nweight_decay = 0.1\n"
    "checkpoint_every = 100\neval_every = 100\neval_batches = 1\nlog_every = 100\n";

struct Fixture {
  fs::path dir = fs::temp_directory_path() / ("dflash-steps-" + std::to_string(::getpid()));
  Fixture() {
    fs::create_directories(dir);
    std::ofstream(dir / "c.toml") << kConfig;
  }
  ~Fixture() { fs::remove_all(dir); }
  std::unique_ptr<detail::Run> prepare(const std::string& out) const {
    RunOptions o;
    o.config = (dir / "c.toml").string();
    o.out_dir = (dir / out).string();
    return detail::prepare(resolve_config(o), o, true, true);
  }
};

// SPEC.md steps 9 and 11 over the run's own micro-batches.
void hand_loop(detail::Run& r) {
  const int64_t D = r.c.train.micro_batches;
  for (int64_t t = 0; t < r.c.train.steps; ++t) {
    for (auto& [name, p] : named(r.w)) p.mutable_grad().reset();
    at::Tensor num = at::zeros({}, at::kDouble), den = at::zeros({}, at::kDouble);
    for (int64_t d = 0; d < D; ++d) {
      const int64_t g = t * D + d;
      const StepInputs in =
          detail::inputs_of(r, data::train_batch(r.c, r.data.train, g), "anchors", g);
      const StepOutputs out = reference::drafter_step(r.c, r.w, r.frozen, in);
      num = num + out.loss * out.weight_sum;  // ce_w * sum(w CE) + kl_w * sum(w KL)
      den = den + out.weight_sum;
    }
    (num / den).backward();
    r.opt->step();
  }
}

TEST(TrainingSteps, RealLoopMatchesSpecLoopAndLeavesFrozenWeightsAlone) {
  Fixture f;
  const auto real = f.prepare("real");
  const auto spec = f.prepare("spec");
  const auto fresh = f.prepare("fresh");
  NamedTensors init;
  for (const auto& [name, p] : named(fresh->w)) init.emplace_back(name, p.detach().clone());

  detail::run_loop(*real);
  hand_loop(*spec);

  const NamedTensors a = named(real->w), b = named(spec->w);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = 1 + b[i].second.abs().max().item<double>();
    const double err = (a[i].second - b[i].second).abs().max().item<double>();
    EXPECT_LE(err, 1e-10 * scale) << a[i].first << ": real loop vs SPEC loop after 4 steps";
    EXPECT_FALSE(at::equal(a[i].second, init[i].second)) << a[i].first << " never moved";
  }
  for (const auto& [name, t] : named(real->frozen)) {
    EXPECT_FALSE(t.requires_grad()) << name;
    EXPECT_FALSE(t.grad().defined()) << name << " received a gradient";
  }
  EXPECT_TRUE(at::equal(real->frozen.embed_tokens, fresh->frozen.embed_tokens)) << "embed moved";
  EXPECT_TRUE(at::equal(real->frozen.lm_head, fresh->frozen.lm_head)) << "LM head moved";
  EXPECT_TRUE(at::equal(real->target.norm, fresh->target.norm)) << "target norm moved";
  for (size_t i = 0; i < real->target.layers.size(); ++i)
    EXPECT_TRUE(at::equal(real->target.layers[i].q_proj, fresh->target.layers[i].q_proj))
        << "target layer " << i << " moved";
}

}  // namespace
}  // namespace dflash::train
