// Pre-tokenised JSONL data (data/data.cpp): a clean DataError, or a dataset
// of (N, S) rows whose ids are real tokens of the config's vocabulary.
#include <ATen/ATen.h>

#include <stdexcept>

#include "core/config.h"
#include "data/data.h"
#include "fuzz/fuzz.h"

namespace {
const dflash::Config& config() {
  static const dflash::Config c = dflash::parse_config_toml(R"(
[target]
vocab_size = 64
hidden_size = 8
num_hidden_layers = 4
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 4
intermediate_size = 8
[drafter]
num_hidden_layers = 1
[data]
source = "jsonl"
path = "fuzz.jsonl"
batch_size = 1
seq_len = 16
block_size = 4
max_anchors = 2
mask_token_id = 63
)",
                                                            "fuzz-config.toml");
  return c;
}
}  // namespace

DFLASH_FUZZ_TARGET({
  try {
    const dflash::data::Dataset d = dflash::data::parse_jsonl(config(), input, "fuzz.jsonl");
    if (d.input_ids.size(1) != 16 || d.input_ids.min().item<int64_t>() < 0 ||
        d.input_ids.max().item<int64_t>() >= 64)
      throw std::logic_error("JSONL accepted rows outside the contract");
  } catch (const dflash::data::DataError&) {
  }
})
