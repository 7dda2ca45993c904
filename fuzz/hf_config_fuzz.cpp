// A Hugging Face config.json (core/config.cpp read_hf_config's parser): a
// clean ConfigError or a target config whose numbers are inside their ranges.
#include <stdexcept>

#include "core/config.h"
#include "fuzz/fuzz.h"

DFLASH_FUZZ_TARGET({
  try {
    const dflash::TargetConfig t = dflash::parse_hf_config(input, "config.json");
    if (!dflash::config_range("target.vocab_size").contains_int(t.vocab_size) ||
        !dflash::config_range("target.hidden_size").contains_int(t.shape.hidden_size))
      throw std::logic_error("config.json accepted a value outside its range");
  } catch (const dflash::ConfigError&) {
  }
})
