// Hugging Face model directories (Qwen3 architecture) in and out.
//
// In: DIR/config.json (read_hf_config, core/config.h) and the weights as
// DIR/model.safetensors or sharded with DIR/model.safetensors.index.json
// ({"weight_map": {tensor name: shard file}}). A tied model may omit
// lm_head.weight (it then is the embedding). Every tensor is checked against
// the shape config.json implies; errors name the file and the tensor.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "core/weights.h"

namespace dflash::models {

// target.source = "fixture" (seeded) or "hf" (target.path), in the run dtype.
TargetWeights load_target(const Config& c);
TargetWeights load_hf_target(const Config& c);
// Only the frozen embedding / LM head the drafter borrows (a drafter rank of
// the split need not hold the target).
FrozenWeights load_frozen(const Config& c);

// The Qwen3 fields of a config.json for `shape` (architectures, model_type,
// hidden_size, ..., torch_dtype).
nlohmann::json qwen3_fields(const LayerShape& shape, int64_t vocab_size, int64_t num_layers,
                            bool tie_word_embeddings, const std::string& torch_dtype);

// Writes a Qwen3ForCausalLM directory: config.json plus one model.safetensors
// (shards <= 1) or `shards` files and an index. With tie_word_embeddings the
// lm_head tensor is left out, as Hugging Face saves tied models.
void write_hf_model(const std::string& dir, const Config& c, const TargetWeights& w, int shards);

}  // namespace dflash::models
