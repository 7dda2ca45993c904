// The byte-level target and the report's draft samples: draft samples count
// acceptance exactly as the step's tau does; `dflash train-target` checks its
// options naming the flag; the shipped target directory
// (fixtures/targets/qwen3-bytes) loads in dflash and reproduces its recorded
// held-out bits per byte.
#include "train/lm.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/byte_tokenizer.h"
#include "core/files.h"
#include "core/optim.h"
#include "data/data.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "reference/step.h"
#include "reference/target.h"
#include "train/samples.h"

namespace dflash::train {
namespace {

namespace fs = std::filesystem;
using testing_support::error_of;

// The report's draft samples count acceptance exactly as the step's tau
// does (SPEC step 10): a drafter fitted to a few held-out rows (so that its
// proposals often agree) is asked for samples, and the same anchors through
// the step give the same per-slot hits and the same accepted total.
TEST(DraftSamples, AgreeWithTheStepsTauOnTheSameAnchors) {
  Config c = fixtures::byte_text_config(16, 5);
  c.data.source = "self_distill";
  const TargetWeights t = make_target(c);
  const FrozenWeights f = t.frozen();
  const std::vector<data::TextDoc> docs = {
      {"d", ByteTokenizer::encode("the cat sat on the mat and the dog sat on the log")}};
  const data::Dataset eval = data::self_distill(c, t, 4, "e", &docs);
  DrafterWeights w = make_drafter(c);
  const SampleSource src{&c, reference::drafter_step, &w, &f, &t};
  nlohmann::json got = draft_samples(src, eval, 4, 3);
  ASSERT_EQ(got["samples"].size(), 4u);
  const int64_t N = int64_t(got["samples"][0]["blocks"].size());
  StepInputs in{eval.input_ids, eval.loss_mask, {}, {}, {}};
  std::vector<int64_t> anchors;
  for (const auto& smp : got["samples"]) {
    ASSERT_EQ(int64_t(smp["blocks"].size()), N);
    for (const auto& b : smp["blocks"]) anchors.push_back(b["anchor"].get<int64_t>());
  }
  in.anchors = {at::tensor(anchors, at::kLong).view({4, N}), at::ones({4, N}, at::kBool)};
  const reference::TargetOutputs tf = reference::target_forward(c, t, in.input_ids);
  in.features = tf.features, in.target_hidden = tf.final_hidden;
  OptimConfig oc;
  oc.lr = 3e-2;
  AdamW opt(named(w), oc);
  for (int step = 0; step < 80; ++step) {  // fit the rows: proposals then often agree
    run_step(reference::drafter_step, c, w, f, in);
    opt.step();
  }
  got = draft_samples(src, eval, 4, 3);
  const StepOutputs out = reference::drafter_step(c, w, f, in);
  int64_t accepted = 0;
  std::vector<int64_t> hits(size_t(c.data.block_size), 0);
  for (const auto& smp : got["samples"])
    for (const auto& b : smp["blocks"]) {
      accepted += b["accepted"].get<int64_t>();
      for (size_t k = 0; k < b["proposal"].size(); ++k)
        hits[k + 1] += b["proposal"][k] == b["target"][k];
    }
  EXPECT_GT(accepted, 4) << "the fitted drafter should agree often; the test needs it";
  EXPECT_EQ(accepted, out.accept_sum.item<int64_t>());
  for (int64_t k = 1; k < c.data.block_size; ++k)
    EXPECT_EQ(hits[size_t(k)], out.correct[k].item<int64_t>()) << "slot " << k;
}

// `dflash train-target` refuses unusable options before reading or writing.
TEST(TrainTargetBadInput, OptionsAreCheckedNamingTheFlag) {
  LmRecipe r;
  r.out = "/nonexistent/never-written";
  r.steps = 0;
  EXPECT_NE(
      error_of([&] { train_byte_lm(r); }).find("--steps: expected a positive integer, found 0"),
      std::string::npos);
  r.steps = 10, r.holdout = "/usr/share/common-licenses/Apache-2.0";
  EXPECT_NE(error_of([&] { train_byte_lm(r); }).find("--holdout: expected a file name"),
            std::string::npos);
  r.holdout = "Apache-2.0", r.lr = 0;
  EXPECT_NE(error_of([&] { train_byte_lm(r); }).find("--lr: expected in (0, 1)"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(r.out));
}

// The shipped real-text target: its config.json, tokenizer and weights load
// through dflash's Hugging Face path, and dflash's reference forward gives
// the held-out bits per byte recorded when it was trained.
TEST(RealTextTarget, LoadsAndReproducesItsHeldOutBitsPerByte) {
  const std::string dir = testing_support::source_dir() + "/fixtures/targets/qwen3-bytes";
  const nlohmann::json result =
      nlohmann::json::parse(read_whole_file(dir + "/result.json", "result.json"));
  const TargetConfig t = read_hf_config(dir);
  EXPECT_EQ(t.vocab_size, ByteTokenizer::kVocab);
  EXPECT_TRUE(has_byte_tokenizer(dir));
  const std::string held = result["recipe"]["corpus"].get<std::string>() + "/" +
                           result["recipe"]["holdout"].get<std::string>();
  if (!fs::exists(held)) GTEST_SKIP() << held << " is not on this machine (Debian's base-files)";
  const double bpb = byte_lm_bits_per_byte(dir, held, result["recipe"]["seq_len"].get<int64_t>());
  // The figure was recorded by this same float32 code; 1e-3 leaves room only
  // for another CPU's reduction order (here the two agree exactly).
  EXPECT_NEAR(bpb, result["heldout_bits_per_byte"].get<double>(), 1e-3);
  EXPECT_LT(bpb, 0.6 * result["unigram_bits_per_byte"].get<double>()) << "not a language model";
}

}  // namespace
}  // namespace dflash::train
