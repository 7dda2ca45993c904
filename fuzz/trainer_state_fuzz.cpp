// A checkpoint's manifest, trainer_state.json (models/checkpoint.cpp): a
// clean CheckpointError or a state with non-negative counters and threads
// in [0, 4096].
#include <stdexcept>

#include "fuzz/fuzz.h"
#include "models/checkpoint.h"

DFLASH_FUZZ_TARGET({
  dflash::models::Checkpoint ck;
  try {
    dflash::models::parse_trainer_state(input, "trainer_state.json", ck);
  } catch (const dflash::models::CheckpointError&) {
    return 0;
  }
  if (ck.state.step < 0 || ck.state.cursor < 0 || !ck.config.is_object())
    throw std::logic_error("trainer_state.json accepted a negative counter");
  if (ck.threads < 0 || ck.threads > 4096)
    throw std::logic_error("trainer_state.json accepted threads outside [0, 4096]");
})
