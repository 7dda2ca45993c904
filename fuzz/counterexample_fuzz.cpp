// A component counterexample (`dflash parity --reproduce FILE`,
// harness/component_properties.cpp): parsed and checked without running it.
// A clean std::runtime_error naming the file, or a case small enough to
// replay; a step counterexample is a run config (config_toml_fuzz).
#include <stdexcept>

#include "fuzz/fuzz.h"
#include "harness/properties.h"

DFLASH_FUZZ_TARGET({
  try {
    dflash::harness::validate_component_case(input, "case.toml");
  } catch (const std::logic_error&) {
    throw;  // a bug, not an input error
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("case.toml", 0) != 0)
      throw std::logic_error(std::string("message does not name the file: ") + e.what());
  }
})
