// `dflash eval`: served acceptance of a drafter checkpoint (docs/EVAL.md).
//
// The checkpoint's config.json (what DFlash inference code reads) is checked
// against the target before anything runs: hidden size, vocabulary, the
// tapped layers, the mask id (and the target's byte tokenizer) and the block
// size; each disagreement is an error naming the file and the field. Then
// the prompts (the run's held-out prompts, or --prompts) are decoded plainly,
// by block speculative decoding and by tree decoding at each budget, and the
// teacher-forced tau of the same drafter on the same texts is computed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "models/checkpoint.h"

namespace dflash::decode {

struct EvalOptions {
  std::string checkpoint;        // a checkpoint directory, or a run directory (its newest)
  std::string target;            // a Hugging Face directory; "": the run's target
  std::string prompts;           // a prompt file; "": the run's held-out prompts
  int64_t num_prompts = 16;      // held-out prompts used (a prompt file: all of it)
  int64_t max_new_tokens = 128;  // generated per prompt
  int64_t block_size = 0;        // 0: the trained block size (larger is refused)
  std::vector<int64_t> budgets{1, 4, 16, 64};
  int64_t max_context = 0;          // 0: the target's context limit
  std::string json;                 // also write the report here
  std::string build = "optimized";  // the step that computes tau
  int64_t threads = 0;
};

int run_eval(const EvalOptions& o);

// The integer `key` of a drafter's config.json object `j`; an error naming
// the file and the field (`prefix` names the enclosing object:
// "dflash_config.") otherwise.
int64_t int_field(const nlohmann::json& j, const std::string& file, const std::string& key,
                  const std::string& prefix = "");

// A checkpoint directory as given, or a run directory's newest checkpoint.
std::string resolve_checkpoint(const std::string& path);
// The run config a checkpoint recorded (trainer_state.json), its relative
// paths resolved as the run saw them, the target replaced by the Hugging
// Face directory `target` unless it is "".
nlohmann::json recorded_config(const models::Checkpoint& ck, const std::string& target);

// The drafter's inference config.json (`file`) against the target `t`
// (`target_dir`: its directory for the byte tokenizer, "" for a fixture
// target); `block_size` is the served one (0: the trained one).
void check_drafter_config(const nlohmann::json& drafter, const std::string& file,
                          const TargetConfig& t, const std::string& target_dir, int64_t block_size);

// Prompts from a file: `.jsonl` lines of {"text": ...} or {"input_ids": [...]}
// (the training data's name; "ids" also reads),
// otherwise one UTF-8 text prompt per non-empty line. Text needs a byte
// tokenizer (`byte_text`); errors name the file and line.
// `where`, when given, receives "FILE:LINE" of each prompt.
std::vector<std::vector<int64_t>> read_prompt_file(const std::string& path, bool byte_text,
                                                   int64_t vocab_size,
                                                   std::vector<std::string>* where = nullptr);

}  // namespace dflash::decode
