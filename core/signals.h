// SIGTERM / SIGINT as a stop request (docs/TRAINING.md "Stopping"): the
// handlers only record the signal, one flag per process; the training loop
// and the split read it between steps, the launcher (cli/launch.cpp) between
// polls of its ranks.
#pragma once

namespace dflash {

// One process, and the launcher: a second signal acts as if none were caught
// (SA_RESETHAND).
void install_stop_handlers();
// A rank of the split (train/split.cpp): repeats are absorbed (the launcher
// forwards what it receives), and a signal queued (sigqueue) with
// kEndRankNow, the launcher ending the ranks after another rank failed, ends
// the rank at once as if none were caught.
void install_rank_stop_handlers();
// The signal that asked to stop, 0 when none came.
int stop_requested();

inline constexpr int kEndRankNow = 0x0df1a5;

}  // namespace dflash
