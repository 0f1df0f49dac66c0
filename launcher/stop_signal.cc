#include "launcher/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace weft {
namespace {

// The first stop signal's number, 0 before any. A lock-free atomic, so storing it from a handler
// is async-signal-safe.
std::atomic<int> first_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler's flag must be lock-free");

// Both signals get the default action back, not only the one received (SA_RESETHAND), so that a
// SIGINT after a SIGTERM also ends the process at once. sigaction is async-signal-safe.
void restore_default_actions() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

void record_stop_signal(int signal_number) {
  int none = 0;
  first_stop_signal.compare_exchange_strong(none, signal_number);
  restore_default_actions();
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = record_stop_signal;
  // Both blocked while the handler runs: a second signal waits for the default actions, then ends
  // the process.
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGTERM);
  sigaddset(&action.sa_mask, SIGINT);
  // SA_RESETHAND: the received signal's default action is back before the handler starts.
  // SA_RESTART: reads and writes in progress (a checkpoint, MPI's sockets) resume instead of
  // failing with EINTR.
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  for (const int signal_number : {SIGTERM, SIGINT}) {
    WEFT_CHECK(sigaction(signal_number, &action, nullptr) == 0, "cannot install the handler for signal ",
               signal_number, ": ", std::strerror(errno));
  }
}

bool stop_requested() { return first_stop_signal.load(std::memory_order_relaxed) != 0; }

std::string stop_signal_name() {
  switch (first_stop_signal.load(std::memory_order_relaxed)) {
    case 0: return "";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace weft
