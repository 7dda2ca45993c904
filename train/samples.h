// Draft samples for the report: for a few held-out rows, the drafter's
// greedy block proposal at several anchors beside the tokens the target
// wrote there, with the accepted prefix (SPEC.md step 10: leading slots
// k >= 1 whose argmax equals the label). Teacher-forced, like tau.
#pragma once

#include <nlohmann/json.hpp>

#include "core/step.h"
#include "data/data.h"

namespace dflash::train {

struct SampleSource {
  const Config* c;
  StepFn fn;  // the run's step (its student_hidden gives the proposals)
  const DrafterWeights* w;
  const FrozenWeights* frozen;
  const TargetWeights* target;  // for the features; unused when the data carries them
  c10::Device device{c10::kCPU};
};

// {"tokenizer": "byte" | "ids", "samples": [{"row", "prompt": [ids],
// "continuation": [ids], "blocks": [{"anchor", "proposal": [ids],
// "target": [ids], "accepted"}]}]}: `rows` held-out rows from `eval`,
// `anchors` anchors each, evenly spaced over the row's counted positions.
nlohmann::json draft_samples(const SampleSource& s, const data::Dataset& eval, int64_t rows,
                             int64_t anchors);

}  // namespace dflash::train
