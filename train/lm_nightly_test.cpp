// Regenerating the real-text target (`dflash train-target` with the default
// recipe, ~5 minutes on 2 cores) reproduces the shipped directory's held-out
// bits per byte within the stated tolerance (docs/TRAINING.md: 0.02 on
// another CPU; the same machine and thread count give the same figure).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/safetensors.h"
#include "fixtures/test_support.h"
#include "train/lm.h"

namespace dflash::train {
namespace {

TEST(RealTextTargetNightly, RegenerationReproducesTheHeldOutLoss) {
  const std::string dir = testing_support::source_dir() + "/fixtures/targets/qwen3-bytes";
  const nlohmann::json shipped =
      nlohmann::json::parse(read_whole_file(dir + "/result.json", "result.json"));
  LmRecipe r;
  if (!std::filesystem::exists(r.corpus + "/" + r.holdout))
    GTEST_SKIP() << r.corpus << " is not on this machine (Debian's base-files)";
  testing_support::TmpDir tmp;
  r.out = tmp / "qwen3-bytes";
  r.log_every = 250;
  const LmResult got = train_byte_lm(r);
  EXPECT_EQ(shipped["recipe"],
            nlohmann::json::parse(read_whole_file(r.out + "/result.json", "result.json"))["recipe"])
      << "the default recipe is not the one the shipped target was trained with";
  EXPECT_NEAR(got.heldout_bpb, shipped["heldout_bits_per_byte"].get<double>(), 0.02);
  EXPECT_NEAR(got.unigram_bpb, shipped["unigram_bits_per_byte"].get<double>(), 1e-9);
}

}  // namespace
}  // namespace dflash::train
