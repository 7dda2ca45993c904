// The run config (TOML, core/config.cpp): a clean ConfigError or a valid
// config, and a valid config's resolved TOML parses back to the same config.
#include <stdexcept>

#include "core/config.h"
#include "fuzz/fuzz.h"

DFLASH_FUZZ_TARGET({
  dflash::Config c;
  try {
    c = dflash::parse_config_toml(input, "fuzz.toml");
  } catch (const dflash::ConfigError&) {
    return 0;
  }
  const std::string resolved = dflash::config_to_toml(c);
  const dflash::Config back = dflash::parse_config_toml(resolved, "resolved.toml");
  if (dflash::config_to_toml(back) != resolved)
    throw std::logic_error("resolved config does not round-trip:\n" + resolved);
})
