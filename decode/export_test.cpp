// `dflash export` and `--init-from` (decode/export.h, docs/SERVING.md): the
// files of both layouts, the atomic write and its refusals, and the round
// trip (export, read back, identical parameters and step). The real client
// (speculators) and the engines' loading rules: export_interop_test.py.
#include "decode/export.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/files.h"
#include "core/init.h"
#include "core/optim.h"
#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "models/checkpoint.h"
#include "models/hf.h"
#include "reference/step.h"

namespace dflash::decode {
namespace {
namespace fs = std::filesystem;
using testing_support::error_of;
using testing_support::TmpDir;

// A float32 run of a 3-layer Hugging Face target, tapping layers 0 and 1,
// with one checkpoint (step 5) in RUN.
struct ExportRun {
  TmpDir tmp;
  Config c;
  DrafterWeights w;
  std::string run = tmp / "run", target = tmp / "target";

  explicit ExportRun(std::vector<int64_t> taps = {0, 1}, bool allow_last = false) {
    Config t;
    t.path = "<export>";
    t.target.vocab_size = 40, t.target.num_hidden_layers = 3;
    t.target.shape.hidden_size = 16, t.target.shape.intermediate_size = 24;
    t.target.shape.head_dim = 4, t.target.shape.num_attention_heads = 4;
    t.target.shape.num_key_value_heads = 2, t.target.shape.rope_theta = 1e4;
    t.target.init_std = 0.2;
    t.drafter.num_hidden_layers = 2, t.drafter.shape = t.target.shape;
    t.drafter.target_layer_ids = taps, t.drafter.allow_last_layer_tap = allow_last;
    t.drafter.init_std = 0.2, t.drafter.norm_init_jitter = 0.1;
    t.data.batch_size = 2, t.data.seq_len = 12, t.data.block_size = 4, t.data.max_anchors = 3;
    t.data.mask_token_id = 39;
    t.run.dtype = DType::kFloat32, t.run.seed = 11;
    validate_config(t);
    models::write_hf_model(target, t, make_target(t), 1);
    c = t;
    c.target.source = "hf", c.target.path = target;
    w = make_drafter(c);
    AdamW opt(named(w), optim_config(c.train));
    models::save_checkpoint(run, c, w, opt, {5, 5});
  }
  std::string out(const std::string& name) const { return tmp / name; }
  void export_to(const std::string& format, const std::string& out_dir,
                 const std::string& dtype = "float32") const {
    ExportOptions o;
    o.source = run, o.format = format, o.out = out_dir, o.dtype = dtype;
    run_export(o);
  }
};

nlohmann::json config_of(const std::string& dir) {
  return parse_json(read_whole_file(dir + "/config.json"), dir + "/config.json");
}

TEST(Export, ZlabLayoutIsWhatVllmAndSglangRead) {
  const ExportRun r;
  r.export_to("zlab", r.out("zlab"), "bfloat16");
  const nlohmann::json j = config_of(r.out("zlab"));
  EXPECT_EQ(j["architectures"], nlohmann::json({"DFlashDraftModel"}));
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["block_size"], 4);
  EXPECT_EQ(j["dflash_config"]["block_size"], 4);
  EXPECT_EQ(j["num_target_layers"], 3);
  EXPECT_EQ(j["dflash_config"]["target_layer_ids"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["dflash_config"]["mask_token_id"], 39);
  EXPECT_EQ(j["layer_types"], nlohmann::json({"full_attention", "full_attention"}));
  EXPECT_FALSE(j.contains("is_causal"));
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  const auto f = safetensors::read(r.out("zlab") + "/model.safetensors");
  ASSERT_EQ(f.tensors.size(), named(r.w).size());
  for (const auto& [n, p] : named(r.w)) {
    const at::Tensor t = f.get(n);
    EXPECT_EQ(t.scalar_type(), at::kBFloat16) << n;
    EXPECT_TRUE(at::equal(t, p.to(at::kBFloat16))) << n;
  }
  EXPECT_FALSE(f.has("embed_tokens.weight") || f.has("lm_head.weight"));
  const nlohmann::json prov =
      parse_json(read_whole_file(r.out("zlab") + "/dflash_export.json"), "dflash_export.json");
  EXPECT_EQ(prov["step"], 5);
}

TEST(Export, SpeculatorsLayoutMapsTapsAndNamesTheVerifier) {
  const ExportRun r;
  r.export_to("speculators", r.out("spec"));
  const nlohmann::json j = config_of(r.out("spec"));
  EXPECT_FALSE(j.contains("model_type"));  // how vLLM tells this layout from zlab
  EXPECT_EQ(j["speculators_model_type"], "dflash");
  EXPECT_EQ(j["aux_hidden_state_layer_ids"], nlohmann::json({1, 2}));  // ids + 1
  EXPECT_EQ(j["block_size"], 4);
  EXPECT_EQ(j["mask_token_id"], 39);
  EXPECT_EQ(j["draft_vocab_size"], 40);
  EXPECT_EQ(j["sliding_window_non_causal"], true);
  EXPECT_EQ(j["transformer_layer_config"]["num_hidden_layers"], 2);
  const nlohmann::json& s = j["speculators_config"];
  EXPECT_EQ(s["proposal_methods"][0]["speculative_tokens"], 3);
  EXPECT_EQ(s["verifier"]["name_or_path"], fs::absolute(r.target).lexically_normal().string());
  EXPECT_EQ(s["verifier"]["architectures"], nlohmann::json({"Qwen3ForCausalLM"}));
}

// Export, read back (each layout), start a drafter from it: the parameters
// and the step are identical.
TEST(Export, RoundTripGivesIdenticalParametersAndStep) {
  const ExportRun r;
  const TargetWeights target = models::load_target(r.c);
  const StepInputs in = fixtures::make_step_inputs(r.c, target, 0);
  const StepOutputs want = reference::drafter_step(r.c, r.w, target.frozen(), in);
  for (const std::string format : {"zlab", "speculators"}) {
    r.export_to(format, r.out(format));
    const DrafterDir d = read_drafter_dir(r.out(format));
    EXPECT_EQ(d.layout, format);
    EXPECT_EQ(d.target_layer_ids, r.c.drafter.target_layer_ids);
    Config other = r.c;
    other.run.seed = 99;  // another seeded init, overwritten by the import
    DrafterWeights w = make_drafter(other);
    init_from_drafter(d, r.c, w);
    const auto a = named(r.w), b = named(w);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << format << " " << a[i].first;
    const StepOutputs got = reference::drafter_step(r.c, w, target.frozen(), in);
    EXPECT_TRUE(at::equal(got.loss, want.loss)) << format;
  }
  // A dflash checkpoint reads the same way.
  EXPECT_EQ(read_drafter_dir(r.run + "/checkpoints/step-000005").layout, "dflash checkpoint");
}

TEST(Export, MismatchesWithTheConfigAreEachNamed) {
  const ExportRun r;
  r.export_to("zlab", r.out("zlab"));
  const DrafterDir d = read_drafter_dir(r.out("zlab"));
  Config c = r.c;
  c.drafter.target_layer_ids = {0, 2}, c.drafter.allow_last_layer_tap = true;
  c.data.mask_token_id = 38, c.data.block_size = 6;
  DrafterWeights w = make_drafter(c);
  const std::string e = error_of([&] { init_from_drafter(d, c, w); });
  for (const char* part : {"zlab: does not fit", "3 mismatches",
                           "target_layer_ids: [0, 1] there, [0, 2] in the config",
                           "mask_token_id: 39 there, 38", "block_size: 4 there, 6"})
    EXPECT_NE(e.find(part), std::string::npos) << part << "\n" << e;
  c = r.c;
  c.drafter.num_hidden_layers = 3;
  EXPECT_NE(error_of([&] {
              init_from_drafter(d, c, w);
            }).find("tensor layers.2.input_layernorm.weight: missing"),
            std::string::npos);
  // A tensor whose shape the config.json does not explain.
  DrafterDir bent = d;
  bent.params["fc.weight"] = bent.params["fc.weight"].t();
  w = make_drafter(r.c);
  EXPECT_NE(error_of([&] {
              init_from_drafter(bent, r.c, w);
            }).find("tensor fc.weight: shape [32, 16] there, [16, 32] in the config"),
            std::string::npos);
  // A config.json whose taps no server captures in that order is refused.
  nlohmann::json j = config_of(r.out("zlab"));
  j["dflash_config"]["target_layer_ids"] = {1, 0};
  std::ofstream(r.out("zlab") + "/config.json") << j.dump();
  EXPECT_NE(error_of([&] { read_drafter_dir(r.out("zlab")); })
                .find("config.json: dflash_config.target_layer_ids: expected distinct ids in "
                      "ascending order"),
            std::string::npos);
}

TEST(Export, RefusalsLeaveNothingBehind) {
  const ExportRun last({0, 2}, /*allow_last=*/true);  // trained on the last layer: not servable
  const std::string out = last.out("x");
  EXPECT_NE(error_of([&] { last.export_to("zlab", out); }).find("the target's last layer 2"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out));
  const ExportRun r;
  r.export_to("zlab", r.out("zlab"));
  EXPECT_NE(error_of([&] { r.export_to("zlab", r.out("zlab")); }).find("already exists"),
            std::string::npos);
  // A damaged checkpoint: the error names the file.
  const std::string st = r.run + "/checkpoints/step-000005/model.safetensors";
  fs::resize_file(st, fs::file_size(st) / 2);
  EXPECT_NE(error_of([&] { r.export_to("speculators", r.out("y")); }).find(st), std::string::npos);
  EXPECT_FALSE(fs::exists(r.out("y")));
  for (const auto& e : fs::directory_iterator(r.tmp.p))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
}

}  // namespace
}  // namespace dflash::decode
