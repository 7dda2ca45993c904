// `dflash step --from --check` on tampered dumps (issue 36): each tampering a
// user's trainer could produce fails, naming the tensor and the file, in
// both modes; untampered dumps pass, dflash's own bit for bit and another
// trainer's (no producer, float32 or bfloat16) by the error ratio.
#include "harness/dump_check.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/safetensors.h"
#include "fixtures/fixtures.h"
#include "fixtures/test_support.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

using testing_support::TmpDir;
using Tamper = std::function<void(NamedTensors&, safetensors::Metadata&)>;

// A dump of the micro config in `dtype`, tampered, then read and checked
// against the reference recomputed on it.
struct Checked {
  std::string path;
  DumpCheck check;
};

Checked dump_and_check(const TmpDir& tmp, DType dtype, const Tamper& tamper, DumpMode mode) {
  Config c = fixtures::micro_config();
  c.run.dtype = dtype;
  const TargetWeights target = make_target(c);
  const DrafterWeights drafter = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 2);
  const StepResult r = run_step(reference::drafter_step, c, drafter, target.frozen(), in);
  const std::string clean = tmp / "clean.safetensors", path = tmp / "tampered.safetensors";
  write_step_dump(clean, c, drafter, target.frozen(), in, r);
  safetensors::File f = safetensors::read(clean);
  tamper(f.tensors, f.metadata);
  safetensors::write(path, f.tensors, f.metadata);
  StepDump d = read_step_dump(path);
  const StepResult again =
      run_step(reference::drafter_step, d.config, d.drafter, d.frozen, d.inputs);
  return {path, check_step_dump(d, again, mode)};
}

at::Tensor& find(NamedTensors& t, const std::string& name) {
  for (auto& [n, v] : t)
    if (n == name) return v;
  throw std::runtime_error("no tensor " + name);
}

void erase_names_if(NamedTensors& t, const std::function<bool(const std::string&)>& pred) {
  NamedTensors kept;
  for (auto& p : t)
    if (!pred(p.first)) kept.push_back(p);
  t = kept;
}

void drop_producer(NamedTensors&, safetensors::Metadata& m) { m.erase("producer"); }

// The check failed and a message names the file and `tensor`.
void expect_caught(const Checked& k, const std::string& tensor, const std::string& words = "") {
  const std::string text = k.check.format();
  EXPECT_FALSE(k.check.ok()) << text;
  EXPECT_NE(text.find(k.path + ": tensor '" + tensor + "'"), std::string::npos) << text;
  if (!words.empty()) {
    EXPECT_NE(text.find(words), std::string::npos) << text;
  }
}

const std::vector<DumpMode> kModes = {DumpMode::kBitwise, DumpMode::kTolerance};

TEST(DumpCheck, UntamperedOwnDumpIsBitForBitInEveryDtype) {
  TmpDir tmp;
  for (DType dt : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
    const Checked k = dump_and_check(
        tmp, dt, [](NamedTensors&, safetensors::Metadata&) {}, DumpMode::kAuto);
    EXPECT_TRUE(k.check.ok()) << k.check.format();
    EXPECT_NE(k.check.mode.find("bit for bit"), std::string::npos);
    // every output and every trainable gradient is a row
    EXPECT_EQ(k.check.report.rows.size(), 9 + drafter_specs(fixtures::micro_config()).size());
  }
}

TEST(DumpCheck, ForeignDumpIsJudgedByTheErrorRatioInItsDtype) {
  TmpDir tmp;
  for (DType dt : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
    const Checked k = dump_and_check(tmp, dt, drop_producer, DumpMode::kAuto);
    EXPECT_TRUE(k.check.ok()) << k.check.format();
    EXPECT_NE(k.check.mode.find("error ratio"), std::string::npos) << k.check.mode;
  }
}

// Each tampering of issue 36's list, one row: what is done to the dump, the
// tensors the failure must name and words the message must hold. Every row
// fails in both modes (a frozen weight's gradient or a NaN is never within a
// tolerance).
struct TamperCase {
  const char* name;
  Tamper tamper;
  std::vector<std::string> tensors;
  std::string words;
};

const TamperCase kTamperings[] = {
    {"DoubledGradient",
     [](NamedTensors& t, safetensors::Metadata&) {
       find(t, "grad.layers.0.mlp.up_proj.weight").mul_(2);
     },
     {"grad.layers.0.mlp.up_proj.weight"},
     "max |difference|"},
    {"NanInAGradient",
     [](NamedTensors& t, safetensors::Metadata&) {
       find(t, "grad.fc.weight").view(-1)[3] = std::nan("");
     },
     {"grad.fc.weight"},
     "1 NaN"},
    {"MissingGradient",
     [](NamedTensors& t, safetensors::Metadata&) {
       erase_names_if(t, [](const std::string& n) { return n == "grad.norm.weight"; });
     },
     {"grad.norm.weight"},
     "missing"},
    {"EveryGradientMissing",
     [](NamedTensors& t, safetensors::Metadata&) {
       erase_names_if(t, [](const std::string& n) { return n.rfind("grad.", 0) == 0; });
     },
     {"grad.fc.weight", "grad.layers.1.mlp.down_proj.weight"},
     "missing"},
    {"ChangedStudentHidden",
     [](NamedTensors& t, safetensors::Metadata&) {
       find(t, "output.student_hidden").view(-1)[5] += 0.25;
     },
     {"output.student_hidden"},
     ""},
    {"GradientOfAFrozenWeight",
     [](NamedTensors& t, safetensors::Metadata&) {
       t.emplace_back("grad.embed_tokens.weight", at::zeros_like(find(t, "embed_tokens.weight")));
     },
     {"grad.embed_tokens.weight"},
     "frozen weight has a gradient"},
    {"TransposedGradientIsAShapeError",
     [](NamedTensors& t, safetensors::Metadata&) {
       at::Tensor& g = find(t, "grad.layers.0.mlp.down_proj.weight");
       g = g.t().contiguous();
     },
     {"grad.layers.0.mlp.down_proj.weight"},
     "shape"},
};

class Tampered : public testing::TestWithParam<TamperCase> {};

TEST_P(Tampered, FailsInBothModesNamingTheTensorAndTheFile) {
  TmpDir tmp;
  for (DumpMode m : kModes) {
    const Checked k = dump_and_check(tmp, DType::kFloat32, GetParam().tamper, m);
    for (const std::string& tensor : GetParam().tensors) expect_caught(k, tensor, GetParam().words);
  }
}

INSTANTIATE_TEST_SUITE_P(DumpCheck, Tampered, testing::ValuesIn(kTamperings),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(DumpCheck, UnknownTensorFails) {
  TmpDir tmp;
  const Checked k = dump_and_check(
      tmp, DType::kFloat32,
      [](NamedTensors& t, safetensors::Metadata&) {
        t.emplace_back("grad.layers.7.mlp.up_proj.weight", at::zeros({2, 2}));
        t.emplace_back("output.perplexity", at::zeros({}));
      },
      DumpMode::kTolerance);
  expect_caught(k, "grad.layers.7.mlp.up_proj.weight", "no trainable parameter");
  expect_caught(k, "output.perplexity", "unknown output");
}

TEST(DumpCheck, ChangedLossFailsBitwiseAndOutOfToleranceFailsByRatio) {
  TmpDir tmp;
  const Tamper nudge = [](NamedTensors& t, safetensors::Metadata&) {
    at::Tensor& l = find(t, "output.loss");
    l = l * (1 + 1e-6);  // within float32's reach, far past its rounding
  };
  expect_caught(dump_and_check(tmp, DType::kFloat64, nudge, DumpMode::kBitwise), "output.loss");
  expect_caught(dump_and_check(tmp, DType::kFloat64, nudge, DumpMode::kTolerance), "output.loss");
}

}  // namespace
}  // namespace dflash::harness
