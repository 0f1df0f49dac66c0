#include "parallel/comm/fault_handler.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

namespace weft {
namespace {

struct PeerProcess {
  int64_t pid = 0;
  uint64_t host = 0;  // hash of the host name
};

std::mutex peers_mutex;
std::vector<PeerProcess> peers;  // by world rank

std::mutex hooks_mutex;
std::map<int, std::function<void()>> hooks;
int next_hook_id = 1;

std::atomic<bool> aborting{false};

uint64_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (const char* c = name; *c; ++c) hash = (hash ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return hash;
}

// What a peer process is doing, as far as this host can tell.
enum class PeerState : uint8_t { kRunning, kGone, kStopped, kUnknown };

// Gone: no such process, or a zombie not yet reaped by its launcher. Stopped: SIGSTOP or a
// debugger holds it (/proc state T or t), so it is alive and will never arrive.
PeerState peer_state(int64_t pid) {
  if (pid <= 0) return PeerState::kUnknown;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH ? PeerState::kGone : PeerState::kUnknown;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_text, command, state;
  if (!(stat >> pid_text >> command >> state)) return PeerState::kUnknown;
  if (state == "Z" || state == "X") return PeerState::kGone;
  if (state == "T" || state == "t") return PeerState::kStopped;
  return PeerState::kRunning;
}

void run_hooks_briefly() {
  std::vector<std::function<void()>> to_run;
  {
    std::lock_guard<std::mutex> lock(hooks_mutex);
    for (auto& [id, hook] : hooks) to_run.push_back(hook);
  }
  if (to_run.empty()) return;
  // A hook may itself hang on a broken peer (ncclCommAbort on a wedged device): give them 5 s in all.
  auto state = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
  auto done = std::make_shared<bool>(false);
  std::thread([to_run, state, done] {
    for (const auto& hook : to_run) {
      try {
        hook();
      } catch (...) {
      }
    }
    std::lock_guard<std::mutex> lock(state->first);
    *done = true;
    state->second.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(state->first);
  state->second.wait_for(lock, std::chrono::seconds(5), [&] { return *done; });
}

}  // namespace

void abort_all(const std::string& message) {
  if (aborting.exchange(true)) {
    // Another thread is already ending the process.
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const int rank = mpi_world_rank();
  std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  run_hooks_briefly();
  if (mpi_is_active() && mpi_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void abort_all_if_distributed(const std::string& message) {
  if (mpi_world_size() > 1) abort_all(message);
}

double comm_timeout_seconds() {
  static const double seconds = [] {
    const char* text = std::getenv("WEFT_COMM_TIMEOUT_S");
    if (text == nullptr || *text == '\0') return 60.0;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    WEFT_CHECK(end != text && *end == '\0' && value > 0, "WEFT_COMM_TIMEOUT_S must be a positive number of seconds, got '",
               text, "'");
    return value;
  }();
  return seconds;
}

int add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  hooks.emplace(next_hook_id, std::move(hook));
  return next_hook_id++;
}

void remove_abort_hook(int id) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  hooks.erase(id);
}

void record_peer_processes() {
  if (!mpi_is_active()) return;
  PeerProcess self{static_cast<int64_t>(getpid()), host_hash()};
  int64_t mine[2] = {self.pid, static_cast<int64_t>(self.host)};
  std::vector<int64_t> all(2 * static_cast<size_t>(mpi_world_size()));
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, MPI_COMM_WORLD));
  }
  std::lock_guard<std::mutex> lock(peers_mutex);
  peers.assign(all.size() / 2, {});
  for (size_t r = 0; r < peers.size(); ++r) peers[r] = {all[2 * r], static_cast<uint64_t>(all[2 * r + 1])};
}

std::string describe_failed_peers(const std::vector<int>& world_ranks) {
  std::lock_guard<std::mutex> lock(peers_mutex);
  const uint64_t here = host_hash();
  std::string text;
  for (int rank : world_ranks) {
    if (rank < 0 || rank >= static_cast<int>(peers.size())) continue;
    const PeerProcess& peer = peers[static_cast<size_t>(rank)];
    if (peer.host != here) continue;
    const PeerState state = peer_state(peer.pid);
    if (state == PeerState::kGone) {
      text += str(text.empty() ? "" : ", ", "rank ", rank, " (pid ", peer.pid, ") has exited");
    } else if (state == PeerState::kStopped) {
      text += str(text.empty() ? "" : ", ", "rank ", rank, " (pid ", peer.pid, ") is stopped (SIGSTOP or a debugger)");
    }
  }
  return text;
}

}  // namespace weft
