// Drafters out to serving stacks, and in again (docs/SERVING.md).
//
// `dflash export` writes a trained drafter in one of two layouts:
//   zlab         the DFlash layout vLLM and SGLang read: config.json with
//                architectures ["DFlashDraftModel"], the Qwen3 fields,
//                layer_types all "full_attention" (the drafter stays
//                bidirectional), block_size at the top level and inside
//                dflash_config, num_target_layers, dflash_config
//                {mask_token_id, target_layer_ids}; model.safetensors with
//                the drafter's own tensors only (no embedding, no LM head);
//   speculators  vLLM's speculators layout: speculators_model_type "dflash",
//                transformer_layer_config (the Qwen3 fields),
//                aux_hidden_state_layer_ids = target_layer_ids + 1 (Hugging
//                Face hidden_states indices), block_size, mask_token_id,
//                draft_vocab_size, speculators_config (greedy proposals of
//                block_size - 1 tokens, the verifier's path and
//                architecture), sliding_window_non_causal = true (vLLM then
//                keeps every layer non-causal).
// Both directories are written under a temporary name and renamed into place;
// a failure leaves nothing at --out.
//
// `dflash train --init-from DIR` reads any of the three layouts (a dflash
// checkpoint, zlab, speculators) back and checks it against the run's config.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::decode {

struct ExportOptions {
  std::string source;              // a checkpoint directory, or a run directory (its newest)
  std::string format;              // "zlab" or "speculators"
  std::string out;                 // the directory to write (must not exist)
  std::string dtype = "bfloat16";  // "bfloat16" or "float32"
  std::string verifier;            // the target's Hugging Face directory; "": the run's target
};

int run_export(const ExportOptions& o);

// The config.json of each layout for a drafter trained with `c`, stored in
// `dtype`. The speculators one names the verifier (its directory and its
// config.json's architectures).
nlohmann::json zlab_config_json(const Config& c, const std::string& dtype);
nlohmann::json speculators_config_json(const Config& c, const std::string& dtype,
                                       const std::string& verifier_path,
                                       const nlohmann::json& verifier_architectures);

// A drafter directory read back: its layout, what it says about the target
// and the draft, and its tensors by the Hugging Face DFlash names.
struct DrafterDir {
  std::string dir, layout;  // "dflash checkpoint", "zlab" or "speculators"
  std::vector<int64_t> target_layer_ids;
  int64_t mask_token_id = -1, block_size = 0, num_target_layers = 0;
  int64_t num_hidden_layers = 0, vocab_size = 0;
  LayerShape shape;
  std::map<std::string, at::Tensor> params;  // the drafter's own tensors
};
// Errors name the file and the field.
DrafterDir read_drafter_dir(const std::string& dir);

// Every way `d` disagrees with `c` (shapes, taps, mask id, block size,
// tensors and their shapes), one line each; empty when it fits.
std::vector<std::string> drafter_mismatches(const DrafterDir& d, const Config& c);

// `w` takes `d`'s tensors (cast to w's dtype and device); throws naming every
// mismatch first.
void init_from_drafter(const DrafterDir& d, const Config& c, DrafterWeights& w);

}  // namespace dflash::decode
