// `dflash train` end to end on a small self-distillation config: resume is
// bit-exact after a kill; a kill while a checkpoint is written leaves the
// previous one loadable; an existing run or a different config is refused
// with nothing overwritten; a non-finite loss stops the run with a dump that
// names the first non-finite tensor; offline features train like the online
// target; --skip-preflight is loud; the report is written. The fault
// matrix (issue 36): a failed checkpoint write leaves no temp directory, a
// damaged newest checkpoint is passed over on --resume, more steps or
// another rate resume, SIGTERM / SIGINT checkpoint and resume bit-exactly,
// and `dflash eval` works from another directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "harness/step_dump.h"
#include "models/checkpoint.h"
#include "models/hf.h"

namespace dflash::train {
namespace {

namespace fs = std::filesystem;
using testing_support::dflash;
using testing_support::sh;
using testing_support::Shell;
using testing_support::TmpDir;

// Small enough that a step takes milliseconds; float64 so that offline and
// online features agree to 1e-10.
std::string small_config(const std::string& data =
                             "source = \"self_distill\"\nnum_samples = 24\n"
                             "eval_samples = 8\nprompt_len = 4\n",
                         const std::string& extra = "") {
  return "[target]\nvocab_size = 64\nhidden_size = 16\nnum_hidden_layers = 4\n"
         "num_attention_heads = 4\nnum_key_value_heads = 2\nhead_dim = 8\nintermediate_size = 32\n"
         "init_std = 0.2\n[drafter]\nnum_hidden_layers = 2\ntarget_layer_ids = [1, 2]\n"
         "init_std = 0.2\n[data]\n" +
         data +
         "batch_size = 4\nseq_len = 20\nblock_size = 4\nmax_anchors = 4\nmask_token_id = 63\n"
         "[loss]\nkl_weight = 0.5\ngamma = 2.0\nchunk_size = 5\n[run]\nseed = 5\ndtype = "
         "\"float64\"\n[optimized]\ncheckpoint_layers = true\nattention_tile = 7\n[train]\n"
         "steps = 4\nlr = 1e-2\nwarmup_steps = 1\ncheckpoint_every = 2\neval_every = 2\n"
         "eval_batches = 2\nlog_every = 1\n" +
         extra;
}

struct RunFixture {
  TmpDir tmp;
  std::string config = tmp / "small.toml";
  explicit RunFixture(const std::string& text = small_config()) { std::ofstream(config) << text; }
  Shell train(const std::string& out, const std::string& args = "", const std::string& env = "") {
    return sh(env + " " + dflash() + " train --skip-preflight --config " + config + " --out-dir " +
              (tmp / out) + " --out-params " + (tmp / (out + ".params")) + " " + args);
  }
  safetensors::File params(const std::string& out) {
    return safetensors::read(tmp / (out + ".params"));
  }
};

void expect_bitwise_equal(const safetensors::File& a, const safetensors::File& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i)
    EXPECT_TRUE(at::equal(a.tensors[i].second, b.get(a.tensors[i].first))) << a.tensors[i].first;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Resume, KillThenResumeIsBitExact) {
  RunFixture f;
  const Shell straight = f.train("straight");
  ASSERT_EQ(straight.code, 0) << straight.out;
  const Shell killed = f.train("resumed", "", "DFLASH_TEST_EXIT_AFTER_STEP=2");
  ASSERT_EQ(killed.code, 9) << killed.out;
  ASSERT_FALSE(fs::exists(f.tmp / "resumed.params"));
  const Shell resumed = f.train("resumed", "--resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
  // It continued (a restart from step 0 would also end equal to `straight`).
  EXPECT_EQ(resumed.out.find("step     1  loss"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("step     3  loss"), std::string::npos) << resumed.out;
  expect_bitwise_equal(f.params("straight"), f.params("resumed"));
  // metrics.jsonl holds each step once.
  std::ifstream m(f.tmp / "resumed/metrics.jsonl");
  int train_lines = 0;
  for (std::string l; std::getline(m, l);)
    train_lines += l.find("\"kind\":\"train\"") != std::string::npos;
  EXPECT_EQ(train_lines, 4);
}

TEST(Resume, KillDuringCheckpointWriteKeepsThePreviousOne) {
  RunFixture f;
  const Shell straight = f.train("straight");
  ASSERT_EQ(straight.code, 0) << straight.out;
  const Shell killed = f.train("run", "", "DFLASH_TEST_CRASH_IN_CHECKPOINT=4");
  ASSERT_EQ(killed.code, 9) << killed.out;
  const auto latest = models::latest_checkpoint(f.tmp / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "step-000002");
  const models::Checkpoint ck = models::read_checkpoint(*latest);  // loadable
  EXPECT_EQ(ck.state.step, 2);
  const Shell resumed = f.train("run", "--resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out.find("step     1  loss"), std::string::npos) << resumed.out;  // continued
  expect_bitwise_equal(f.params("straight"), f.params("run"));
}

TEST(Refusals, ExistingRunWithoutResumeOverwritesNothing) {
  RunFixture f;
  ASSERT_EQ(f.train("run").code, 0);
  const std::string before = slurp(f.tmp / "run/checkpoints/step-000004/model.safetensors");
  const std::string metrics = slurp(f.tmp / "run/metrics.jsonl");
  const Shell again = f.train("run");
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.out.find("already holds checkpoints"), std::string::npos) << again.out;
  EXPECT_EQ(before, slurp(f.tmp / "run/checkpoints/step-000004/model.safetensors"));
  EXPECT_EQ(metrics, slurp(f.tmp / "run/metrics.jsonl"));
}

TEST(Refusals, CheckpointOfADifferentConfigIsRefused) {
  RunFixture f;
  ASSERT_EQ(f.train("run", "--steps 2").code, 0);
  const std::string metrics = slurp(f.tmp / "run/metrics.jsonl");
  std::ofstream(f.config) << small_config().replace(small_config().find("gamma = 2.0"), 11,
                                                    "gamma = 3.0");
  const Shell r = f.train("run", "--resume");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("loss.gamma is 2.0 there but 3.0"), std::string::npos) << r.out;
  EXPECT_EQ(metrics, slurp(f.tmp / "run/metrics.jsonl"));
}

TEST(NonFinite, StopsWithADumpNamingTheFirstNonFiniteTensor) {
  RunFixture f;
  const Shell r = f.train("run", "--test-poison-step 3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("at step 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first non-finite tensor: fc.weight"), std::string::npos) << r.out;
  const std::string dump = f.tmp / "run/nonfinite-step-000003.safetensors";
  ASSERT_TRUE(fs::exists(dump)) << r.out;
  const harness::StepDump d = harness::read_step_dump(dump);
  EXPECT_FALSE(at::isfinite(d.drafter.fc).all().item<bool>());
  const Shell replay = sh(dflash() + " step --from " + dump);
  EXPECT_NE(replay.out.find("nan"), std::string::npos) << replay.out;
}

TEST(Features, OfflineTrainingMatchesTheOnlineTarget) {
  RunFixture online;
  ASSERT_EQ(online.train("run").code, 0);
  const Shell feat = sh(dflash() + " features --config " + online.config + " --out " +
                        (online.tmp / "feat") + " --shard-samples 10");
  ASSERT_EQ(feat.code, 0) << feat.out;
  RunFixture offline(
      small_config("source = \"features\"\npath = \"" + (online.tmp / "feat") + "\"\n"));
  const Shell r = offline.train("run");
  ASSERT_EQ(r.code, 0) << r.out;
  // float64; the target runs over shards of 10 rows offline and micro-batches
  // of 4 online, so GEMM blocking differs in the last bits, not more.
  const auto a = online.params("run"), b = offline.params("run");
  for (const auto& [n, t] : a.tensors) EXPECT_TRUE(at::allclose(t, b.get(n), 1e-9, 1e-11)) << n;
}

TEST(Features, ADirectoryForAnotherTapIsRefused) {
  RunFixture online;
  ASSERT_EQ(
      sh(dflash() + " features --config " + online.config + " --out " + (online.tmp / "feat")).code,
      0);
  // A training config reading that directory with one key changed.
  auto refused = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string text =
        small_config("source = \"features\"\npath = \"" + (online.tmp / "feat") + "\"\n");
    text.replace(text.find(from), from.size(), to);
    RunFixture offline(text);
    const Shell r = offline.train("run");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
  };
  refused("target_layer_ids = [1, 2]", "target_layer_ids = [0, 2]",
          "features.json: target_layer_ids");
  refused("mask_token_id = 63", "mask_token_id = 62", "features.json: mask_token_id");
  // Another target of the same shapes (its seeded init differs).
  refused("init_std = 0.2\n[drafter]", "init_std = 0.3\n[drafter]",
          "features.json: target_identity: written by another target");
  refused("dtype = \"float64\"", "dtype = \"float32\"", "features.json: dtype");
  const Shell zero = sh(dflash() + " features --config " + online.config + " --out " +
                        (online.tmp / "feat0") + " --shard-samples 0");
  EXPECT_NE(zero.code, 0);
  EXPECT_NE(zero.out.find("--shard-samples: expected >= 1"), std::string::npos) << zero.out;
  EXPECT_FALSE(fs::exists(online.tmp / "feat0"));
}

TEST(Observability, ProgressMetricsReportAndALoudSkip) {
  RunFixture f;
  const Shell r = f.train("run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("WARNING: --skip-preflight"), std::string::npos);
  EXPECT_NE(r.out.find("gradient parity"), std::string::npos);
  EXPECT_NE(r.out.find("tok/s  ETA"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("report: " + (f.tmp / "run/report.html")), std::string::npos) << r.out;
  const std::string html = slurp(f.tmp / "run/report.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("held-out per-slot accuracy"), std::string::npos);
  EXPECT_NE(html.find("preflight SKIPPED"), std::string::npos);
  EXPECT_NE(html.find("mask_token_id = 63"), std::string::npos);  // the config
  const Shell again = sh(dflash() + " report " + (f.tmp / "run"));
  EXPECT_EQ(again.code, 0) << again.out;
}

TEST(Gate, FailingPreflightRefusesToTrain) {
  // 0.2 MB of device memory (the plan needs 0.9 MB): an OOM, preflight fails.
  RunFixture f(small_config() + "[topology]\ndevice_memory_gb = 0.0002\nmemory_reserve_gb = 0.0\n");
  const Shell r = sh(dflash() + " train --config " + f.config + " --out-dir " + (f.tmp / "run") +
                     " --preflight-cases 5");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("preflight FAILED"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(f.tmp / "run/checkpoints"));
}

TEST(Data, JsonlRunsEndToEnd) {
  // The same 12 rows (masks with holes) as JSONL and as a safetensors shard:
  // both readers feed the run, which must train bit for bit alike, hold out
  // the same 4 rows and say so; a reader that drops, shifts or misreads a
  // row or a mask entry trains differently.
  TmpDir tmp;
  const int64_t n = 12, S = 20;
  at::Tensor ids = at::zeros({n, S}, at::kLong), mask = at::zeros({n, S}, at::kBool);
  std::ofstream jl(tmp / "d.jsonl");
  for (int64_t i = 0; i < n; ++i) {
    jl << "{\"input_ids\": [";
    for (int64_t s = 0; s < S; ++s) {
      ids[i][s] = (i * 7 + s * 3) % 60;
      jl << (s ? ", " : "") << (i * 7 + s * 3) % 60;
    }
    jl << "], \"loss_mask\": [";
    for (int64_t s = 0; s < S; ++s) {
      const bool m = s >= 5 && (s + i) % 7 != 0;
      mask[i][s] = m;
      jl << (s ? ", " : "") << int(m);
    }
    jl << "]}\n";
  }
  jl.close();
  fs::create_directories(tmp / "shards");
  safetensors::write(tmp / "shards/a.safetensors", {{"input_ids", ids}, {"loss_mask", mask}}, {});
  RunFixture f(
      small_config("source = \"jsonl\"\npath = \"" + (tmp / "d.jsonl") + "\"\neval_samples = 4\n"));
  const Shell r = f.train("run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("data: 8 training samples from " + (tmp / "d.jsonl") + "; 4 held out"),
            std::string::npos)
      << r.out;
  RunFixture g(
      small_config("source = \"shards\"\npath = \"" + (tmp / "shards") + "\"\neval_samples = 4\n"));
  const Shell rs = g.train("run");
  ASSERT_EQ(rs.code, 0) << rs.out;
  expect_bitwise_equal(f.params("run"), g.params("run"));
  // The held-out rows (the last 4) too: the same evaluation losses. And the
  // data was learned from: every step weighted positions and moved weights.
  std::ifstream mj(f.tmp / "run/metrics.jsonl"), ms(g.tmp / "run/metrics.jsonl");
  int steps = 0, evals = 0;
  for (std::string a, b; std::getline(mj, a) && std::getline(ms, b);) {
    const nlohmann::json m = nlohmann::json::parse(a), o = nlohmann::json::parse(b);
    if (m["kind"] == "eval") {
      ++evals;
      EXPECT_EQ(m["loss"].get<double>(), o["loss"].get<double>()) << a << "\n" << b;
    }
    if (m["kind"] != "train") continue;
    ++steps;
    EXPECT_GT(m["weight_sum"].get<double>(), 0.0) << a;
    EXPECT_GT(m["grad_norm"].get<double>(), 0.0) << a;
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(evals, 3);
}

}  // namespace
}  // namespace dflash::train

namespace dflash::train {
namespace {

// The default run (fixtures/configs/tiny-train.toml: the real-text target,
// prompts from text) with fewer self-distilled samples and steps, to fit the
// quick suite: held-out tau starts near 1.0 (an untrained drafter accepts
// almost nothing) and must clearly rise; the run leaves its draft samples.
TEST(DefaultRun, HeldOutTauRises) {
  if (!std::filesystem::exists("/usr/share/common-licenses/Apache-2.0"))
    GTEST_SKIP() << "the default run's text, /usr/share/common-licenses (Debian's base-files), "
                    "is missing";
  TmpDir tmp;
  const Shell copy =
      sh("sed -e 's/^num_samples = 1024/num_samples = 128/' -e 's/^steps = 700/steps = "
         "80/' -e 's/^eval_samples = 64/eval_samples = 32/' -e 's/^eval_batches = 8/eval_batches = "
         "4/' " +
         testing_support::cfg("tiny-train.toml") + " > " + (tmp / "t.toml"));
  ASSERT_EQ(copy.code, 0);
  const Shell r = sh(dflash() + " train --skip-preflight --config " + (tmp / "t.toml") +
                     " --out-dir " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("held-out tau ([0-9.]+) -> ([0-9.]+)")))
      << r.out;
  const double first = std::stod(m[1]), last = std::stod(m[2]);
  EXPECT_LT(first, 1.05) << r.out;
  EXPECT_GT(last, first + 0.3) << r.out;
  // Served acceptance at the start and the end (docs/EVAL.md), then `dflash
  // eval` on the final checkpoint: lossless, budget 1 = block, bigger trees
  // verify more nodes.
  EXPECT_TRUE(std::regex_search(r.out, std::regex("served @ 80: acceptance [0-9.]+  tree 16 ")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("served acceptance [0-9.]+ -> [0-9.]+")))
      << r.out;
  const Shell ev = sh(dflash() + " eval " + (tmp / "run") +
                      " --num-prompts 3 --tokens 40 --budgets 1 16 --json " + (tmp / "ev.json"));
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_NE(ev.out.find("served acceptance (block 8): "), std::string::npos) << ev.out;
  EXPECT_NE(ev.out.find("speed: greedy "), std::string::npos) << ev.out;
  const nlohmann::json e = nlohmann::json::parse(slurp(tmp / "ev.json"));
  EXPECT_EQ(e["block"]["mismatched_prompts"], 0);
  EXPECT_EQ(e["greedy_tokens"], 120);
  EXPECT_EQ(e["block"]["tokens"], 120);
  EXPECT_EQ(e["trees"][0]["acceptance"], e["block"]["acceptance"]);
  EXPECT_GT(e["trees"][1]["mean_nodes"].get<double>(), e["trees"][0]["mean_nodes"].get<double>());
  EXPECT_GT(e["tau"].get<double>(), 1.0);
  // The speedup is greedy decoding's time over block decoding's, both timed
  // in this one eval: the same ratio as their tokens/s (the same tokens).
  const double greedy_s = e["greedy_s"], block_s = e["block"]["total_s"];
  EXPECT_DOUBLE_EQ(e["speedup"].get<double>(), greedy_s / block_s);
  EXPECT_NEAR(e["speedup"].get<double>(),
              e["block"]["tokens_per_s"].get<double>() / e["greedy_tokens_per_s"].get<double>(),
              1e-9 * e["speedup"].get<double>());
  // Refusals through the command: a prompt over the context limit, and a
  // checkpoint whose config.json disagrees with the target.
  const Shell longp = sh(dflash() + " eval " + (tmp / "run") + " --num-prompts 1 --max-context 10");
  EXPECT_NE(longp.code, 0);
  EXPECT_NE(longp.out.find("prompt 0: the prompt has 32 tokens, more than the context limit 10"),
            std::string::npos)
      << longp.out;
  const std::string ck = tmp / "ck";
  fs::copy(tmp / "run/checkpoints/step-000080", ck);
  nlohmann::json dj = nlohmann::json::parse(slurp(ck + "/config.json"));
  dj["dflash_config"]["target_layer_ids"] = {1, 4};
  std::ofstream(ck + "/config.json") << dj.dump();
  const Shell bad = sh(dflash() + " eval " + ck + " --num-prompts 1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(
      bad.out.find("config.json: dflash_config.target_layer_ids: expected layer ids in [0, 4) "
                   "(target.num_hidden_layers = 4"),
      std::string::npos)
      << bad.out;
  const nlohmann::json samples = nlohmann::json::parse(slurp(tmp / "run/samples.json"));
  EXPECT_EQ(samples["tokenizer"], "byte");
  ASSERT_GE(samples["samples"].size(), 1u);
  EXPECT_EQ(samples["samples"][0]["blocks"][0]["proposal"].size(), 7u);  // block_size 8 - 1
  for (const auto& smp : samples["samples"])  // accepted = the leading agreeing run only
    for (const auto& b : smp["blocks"]) {
      size_t lead = 0;
      while (lead < b["proposal"].size() && b["proposal"][lead] == b["target"][lead]) ++lead;
      EXPECT_EQ(b["accepted"].get<size_t>(), lead) << b.dump();
    }
}

}  // namespace
}  // namespace dflash::train

namespace dflash::train {
namespace {

// The split (1 target + 2 drafter ranks) trains the config's own data
// (self-distillation by the config's target) like one process with two
// micro-batches per step, writes checkpoints and the report on drafter rank
// 0, and resumes after a kill to the same parameters.
TEST(Split, TrainsTheConfigsDataAndResumesLikeOneProcess) {
  RunFixture f(small_config() +
               "[topology]\nworld_size = 3\ntarget_ranks = [0]\ndrafter_ranks = [1, 2]\n"
               "timeout_s = 30.0\n");
  const Shell single = f.train("single", "--micro-batches 2");
  ASSERT_EQ(single.code, 0) << single.out;
  auto launch = [&](const std::string& out, const std::string& args, const std::string& env) {
    return sh(env + " " + dflash() + " launch --nproc 3 -- train --skip-preflight --config " +
              f.config + " --out-dir " + (f.tmp / out) + " --out-params " +
              (f.tmp / (out + ".params")) + " " + args);
  };
  const Shell split = launch("split", "", "");
  ASSERT_EQ(split.code, 0) << split.out;
  // float64; the split's all-reduce adds the two drafters' gradients in
  // another order than one process does: last-bit differences only.
  const auto a = f.params("single"), b = f.params("split");
  for (const auto& [n, t] : a.tensors) EXPECT_TRUE(at::allclose(t, b.get(n), 1e-10, 1e-12)) << n;
  EXPECT_TRUE(fs::exists(f.tmp / "split/checkpoints/step-000004/model.safetensors"));
  EXPECT_NE(slurp(f.tmp / "split/report.html").find("<svg"), std::string::npos);
  EXPECT_NE(split.out.find("eval @ 4"), std::string::npos) << split.out;

  const Shell killed = launch("resumed", "", "DFLASH_TEST_EXIT_AFTER_STEP=2");
  ASSERT_EQ(killed.code, 9) << killed.out;
  const Shell resumed = launch("resumed", "--resume", "");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out.find("step     1  loss"), std::string::npos) << resumed.out;  // continued
  expect_bitwise_equal(f.params("split"), f.params("resumed"));
}

}  // namespace
}  // namespace dflash::train

namespace dflash::train {
namespace {

// A NaN on drafter rank 1 (the first drafter) at step 2: every drafter sees
// the flag in the all-reduce and stops before the update; the culprit
// writes its dump and names the tensor.
TEST(Split, NonFiniteStopsEveryRankWithADump) {
  RunFixture f(small_config() +
               "[topology]\nworld_size = 3\ntarget_ranks = [0]\ndrafter_ranks = [1, 2]\n"
               "timeout_s = 30.0\n");
  const Shell r = sh(dflash() + " launch --nproc 3 -- train --skip-preflight --config " + f.config +
                     " --out-dir " + (f.tmp / "run") + " --test-poison-step 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("first non-finite tensor: fc.weight"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(f.tmp / "run/nonfinite-step-000002-rank-1.safetensors")) << r.out;
  EXPECT_FALSE(fs::exists(f.tmp / "run/checkpoints/step-000002")) << r.out;
}

}  // namespace
}  // namespace dflash::train

namespace dflash::train {
namespace {

// A Hugging Face directory (sharded, tied) written here is the target of a
// gated run: preflight passes on the config and training reads the model.
TEST(HfTarget, GatedRunTrainsAgainstTheDirectory) {
  TmpDir tmp;
  std::string text = small_config();
  text.replace(text.find("[target]\n"), 9,
               "[target]\nsource = \"hf\"\npath = \"" + (tmp / "model") + "\"\n");
  text.replace(text.find("vocab_size = 64\n"), 16, "");  // from config.json
  RunFixture f(text);
  Config c = load_config(testing_support::cfg("dist-1x2.toml"));  // the same target shape
  c.target.tie_word_embeddings = true;
  c.run.dtype = DType::kFloat64;
  models::write_hf_model(tmp / "model", c, make_target(c), 2);
  const Shell r = sh(dflash() + " train --preflight-cases 5 --config " + f.config + " --out-dir " +
                     (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("preflight: ok"), std::string::npos) << r.out;
  EXPECT_NE(slurp(tmp / "run/report.html").find("preflight passed"), std::string::npos);
}

}  // namespace
}  // namespace dflash::train

namespace dflash::train {
namespace {

std::vector<std::string> tmp_dirs_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) out.push_back(e.path().string());
  return out;
}

// A checkpoint write that fails (the disk fills while the optimizer state is
// written) removes its temporary directory, names the checkpoint, and leaves
// the previous checkpoint whole: resuming from it ends where a straight run
// does.
TEST(Faults, AFailedCheckpointWriteLeavesNoTempDirectory) {
  RunFixture f;
  ASSERT_EQ(f.train("straight").code, 0);
  const Shell full = f.train("run", "", "DFLASH_TEST_FULL_DISK_IN_CHECKPOINT=4");
  EXPECT_NE(full.code, 0) << full.out;
  EXPECT_NE(full.out.find("writing checkpoint step-000004 failed"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("disk full"), std::string::npos) << full.out;
  EXPECT_TRUE(tmp_dirs_in(f.tmp / "run/checkpoints").empty()) << full.out;
  const auto latest = models::latest_checkpoint(f.tmp / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "step-000002");
  EXPECT_EQ(models::read_checkpoint(*latest).state.step, 2);
  const Shell resumed = f.train("run", "--resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  expect_bitwise_equal(f.params("straight"), f.params("run"));
}

// --resume with the newest checkpoint damaged falls back to the newest
// intact one, naming the damaged one, and sets it aside; with every
// checkpoint damaged it refuses, naming each.
TEST(Faults, ResumePassesOverADamagedNewestCheckpoint) {
  RunFixture f;
  ASSERT_EQ(f.train("straight").code, 0);
  ASSERT_EQ(f.train("run", "", "DFLASH_TEST_EXIT_AFTER_STEP=4").code, 9);  // before the end
  const std::string ck4 = f.tmp / "run/checkpoints/step-000004";
  fs::resize_file(ck4 + "/model.safetensors", 100);  // truncated
  const Shell resumed = f.train("run", "--resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("warning: " + ck4 + " is damaged"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from " + (f.tmp / "run/checkpoints/step-000002")),
            std::string::npos)
      << resumed.out;
  EXPECT_NE(resumed.out.find("step     3  loss"), std::string::npos) << resumed.out;
  expect_bitwise_equal(f.params("straight"), f.params("run"));
  EXPECT_EQ(models::read_checkpoint(ck4).state.step, 4);  // written anew
  // Every checkpoint damaged: refused, each named.
  fs::resize_file(ck4 + "/model.safetensors", 100);
  std::ofstream(f.tmp / "run/checkpoints/step-000002/trainer_state.json") << "{\"step\": ";
  const Shell refused = f.train("run", "--resume");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.out.find("no intact checkpoint to resume from"), std::string::npos)
      << refused.out;
  EXPECT_NE(refused.out.find(ck4 + ": "), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("step-000002: "), std::string::npos) << refused.out;
}

// A finished run resumed with more steps and another peak rate continues
// from its recorded step on the new schedule: the rates of steps 5 and 6 are
// those of a straight run with that schedule. Other keys stay refused
// (Refusals.CheckpointOfADifferentConfigIsRefused).
TEST(Resume, MoreStepsAndAnotherRateContinueFromTheRecordedStep) {
  RunFixture f;
  ASSERT_EQ(f.train("run").code, 0);
  const Shell more = f.train("run", "--resume --steps 6 --lr 5e-3");
  ASSERT_EQ(more.code, 0) << more.out;
  EXPECT_NE(more.out.find("resume: train.steps: 4 -> 6"), std::string::npos) << more.out;
  EXPECT_NE(more.out.find("resume: train.lr: 0.01 -> 0.005"), std::string::npos) << more.out;
  EXPECT_NE(more.out.find("schedule continues from step 4"), std::string::npos) << more.out;
  EXPECT_EQ(more.out.find("step     4  loss"), std::string::npos) << more.out;
  EXPECT_NE(more.out.find("step     6  loss"), std::string::npos) << more.out;
  EXPECT_EQ(models::read_checkpoint(f.tmp / "run/checkpoints/step-000006").state.step, 6);
  ASSERT_EQ(f.train("straight", "--steps 6 --lr 5e-3").code, 0);
  auto lr_of = [&](const std::string& run, int64_t step) {
    std::ifstream m(f.tmp / (run + "/metrics.jsonl"));
    for (std::string l; std::getline(m, l);) {
      const nlohmann::json j = nlohmann::json::parse(l);
      if (j["kind"] == "train" && j["step"] == step) return j["lr"].get<double>();
    }
    return -1.0;
  };
  for (int64_t t : {5, 6}) EXPECT_EQ(lr_of("run", t), lr_of("straight", t)) << "step " << t;
  const Shell fewer = f.train("run", "--resume --steps 3");
  EXPECT_NE(fewer.code, 0);
  EXPECT_NE(fewer.out.find("train.steps 3 in " + f.config + " is below the checkpoint's step 6"),
            std::string::npos)
      << fewer.out;
}

// SIGTERM in the middle of step 3: the step finishes, is checkpointed, the
// run exits 143 saying how to resume, and --resume ends bit-identical to an
// uninterrupted run. SIGINT: 130.
TEST(Signals, SigtermCheckpointsTheStepAndResumeIsBitExact) {
  RunFixture f;
  ASSERT_EQ(f.train("straight").code, 0);
  const Shell stopped = f.train("run", "", "DFLASH_TEST_SIGNAL_IN_STEP=3");
  EXPECT_EQ(stopped.code, 143) << stopped.out;
  EXPECT_NE(stopped.out.find("stopped by SIGTERM after step 3 of 4"), std::string::npos)
      << stopped.out;
  EXPECT_NE(stopped.out.find("--out-dir " + (f.tmp / "run") + " --resume"), std::string::npos)
      << stopped.out;
  EXPECT_EQ(models::read_checkpoint(f.tmp / "run/checkpoints/step-000003").state.step, 3);
  EXPECT_FALSE(fs::exists(f.tmp / "run.params"));
  const Shell resumed = f.train("run", "--resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out.find("step     3  loss"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("step     4  loss"), std::string::npos) << resumed.out;
  expect_bitwise_equal(f.params("straight"), f.params("run"));
  const Shell interrupted = f.train("int", "", "DFLASH_TEST_SIGNAL_IN_STEP=1,int");
  EXPECT_EQ(interrupted.code, 130) << interrupted.out;
  EXPECT_NE(interrupted.out.find("stopped by SIGINT after step 1 of 4"), std::string::npos)
      << interrupted.out;
}

// `dflash eval RUN` from another directory: the run's relative target path
// resolves against the directory it started in (trainer_state.json's cwd);
// an older checkpoint without cwd finds it in an ancestor of the run.
TEST(Eval, ARunWithARelativeTargetPathEvaluatesFromElsewhere) {
  TmpDir tmp;
  std::string text = small_config();
  text.replace(text.find("[target]\n"), 9, "[target]\nsource = \"hf\"\npath = \"model\"\n");
  text.replace(text.find("vocab_size = 64\n"), 16, "");
  std::ofstream(tmp / "small.toml") << text;
  Config c = load_config(testing_support::cfg("dist-1x2.toml"));  // the same target shape
  c.target.tie_word_embeddings = true;
  c.run.dtype = DType::kFloat64;
  models::write_hf_model(tmp / "model", c, make_target(c), 1);
  const std::string bin = fs::absolute(dflash()).string();
  const Shell r = sh("cd " + tmp.p.string() + " && " + bin +
                     " train --skip-preflight --config small.toml --out-dir run");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ev = "cd / && " + bin + " eval " + (tmp / "run") +
                         " --num-prompts 1 --tokens 4 --budgets 1 --threads 1";
  const Shell from_root = sh(ev);
  EXPECT_EQ(from_root.code, 0) << from_root.out;
  EXPECT_NE(from_root.out.find("target " + (tmp / "model")), std::string::npos) << from_root.out;
  const std::string state = tmp / "run/checkpoints/step-000004/trainer_state.json";
  nlohmann::json j = nlohmann::json::parse(slurp(state));
  ASSERT_TRUE(j.contains("cwd"));
  j.erase("cwd");  // as older runs wrote it
  std::ofstream(state) << j.dump(2);
  const Shell old_run = sh(ev);
  EXPECT_EQ(old_run.code, 0) << old_run.out;
}

}  // namespace
}  // namespace dflash::train
