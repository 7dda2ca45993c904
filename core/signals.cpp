// SIGTERM / SIGINT handlers; see signals.h.
#include "core/signals.h"

#include <signal.h>

#include <atomic>
#include <csignal>

namespace dflash {

namespace {
// The signal that asked the run to stop (0: none). The handler only stores
// it; the loop reads it between steps.
std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free store");
extern "C" void on_stop_signal(int sig) { stop_signal.store(sig); }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;  // a second signal acts as if none were caught
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

namespace {
extern "C" void on_rank_stop_signal(int sig, siginfo_t* info, void*) {
  if (info && info->si_code == SI_QUEUE && info->si_value.sival_int == kEndRankNow) {
    signal(sig, SIG_DFL);  // blocked until the handler returns, then ends the rank
    raise(sig);
    return;
  }
  stop_signal.store(sig);
}
}  // namespace

void install_rank_stop_handlers() {
  struct sigaction sa {};
  sa.sa_sigaction = on_rank_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;  // no SA_RESETHAND: a repeat is absorbed
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_requested() { return stop_signal.load(); }

}  // namespace dflash
