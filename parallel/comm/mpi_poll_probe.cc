// The poll probe (mpi_poll_probe.h).
#include "parallel/comm/mpi_poll_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/str_format.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_process_group.h"

namespace weft {
namespace {

constexpr int kProbeFloats = (1 << 20) / 4;  // 1 MB: large enough for MPI to move it in fragments
constexpr int kRounds = 3;                   // each way, taking the fastest (a launch's first calls are noisy)
constexpr std::chrono::milliseconds kStagger{1};  // past the 64 quick polls, into the sleeps

// Seconds one all-reduce of `data` over `comm` took on this rank beyond the stagger, waiting with
// `pause_limit_us`. Odd ranks join it kStagger after the others, as ranks of a real step arrive
// at different times: the early ones have backed off into their sleeps by the time data moves,
// which is where sleeping stalls a fragmented transfer (ranks that start together finish a 1 MB
// all-reduce within the first polls, before any sleep).
double time_all_reduce(MPI_Comm comm, std::vector<float>& data, const std::vector<int>& world_ranks,
                       int64_t pause_limit_us) {
  using Clock = std::chrono::steady_clock;
  MPI_Request request = MPI_REQUEST_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Ibarrier(comm, &request));
  }
  wait_for_mpi_request_pausing(request, "the MPI poll probe's barrier", world_ranks, 0);
  const auto start = Clock::now();
  if (mpi_world_rank() % 2 == 1) {
    while (Clock::now() - start < kStagger) {
    }
  }
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data.data(), kProbeFloats, MPI_FLOAT, MPI_MAX, comm, &request));
  }
  wait_for_mpi_request_pausing(request, "the MPI poll probe's 1 MB all-reduce", world_ranks, pause_limit_us);
  return std::chrono::duration<double>(Clock::now() - start - kStagger).count();
}

MpiPollChoice measure() {
  MpiPollChoice choice;
  if (!mpi_is_active() || mpi_world_size() == 1) {
    choice.pause_limit_us = mpi_poll_pause_limit_us();
    return choice;
  }
  const std::vector<int> world_ranks = mpi_world_ranks();
  MPI_Comm comm = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    WEFT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  }
  std::vector<float> data(kProbeFloats, static_cast<float>(mpi_world_rank()));
  time_all_reduce(comm, data, world_ranks, kCpuMpiPollPauseUs);  // warm-up: connections, buffers
  // times[0]: sleeping, times[1]: polling; the ways alternate so that a slow moment hits both.
  double times[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (int round = 0; round < kRounds; ++round) {
    times[0] = std::min(times[0], time_all_reduce(comm, data, world_ranks, kCpuMpiPollPauseUs));
    times[1] = std::min(times[1], time_all_reduce(comm, data, world_ranks, 0));
  }
  // The slowest rank's figures, so that every rank decides alike.
  MPI_Request request = MPI_REQUEST_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, comm, &request));
  }
  wait_for_mpi_request_pausing(request, "the MPI poll probe's result", world_ranks, 0);
  {
    MpiCallLock lock;
    MPI_Comm_free(&comm);
  }
  choice.measured = true;
  choice.sleeping_ms = times[0] * 1e3;
  choice.polling_ms = times[1] * 1e3;
  const char* configured = std::getenv("WEFT_MPI_POLL_PAUSE_US");
  choice.from_environment = configured != nullptr && *configured != '\0';
  // set_ leaves a limit from WEFT_MPI_POLL_PAUSE_US alone.
  set_mpi_poll_pause_limit_us(polling_wins(choice.sleeping_ms, choice.polling_ms) ? 0 : kCpuMpiPollPauseUs);
  choice.pause_limit_us = mpi_poll_pause_limit_us();
  return choice;
}

}  // namespace

bool polling_wins(double sleeping_ms, double polling_ms) {
  return sleeping_ms > 8.0 * polling_ms && sleeping_ms - polling_ms >= 1.0;
}

std::string MpiPollChoice::describe() const {
  const std::string how = pause_limit_us == 0 ? std::string("poll without sleeping")
                                              : absl::StrFormat("sleep up to %d us between polls", pause_limit_us);
  if (!measured) return absl::StrFormat("mpi waits: %s (one process: nothing to measure)", how);
  return absl::StrFormat("mpi waits: %s%s (a 1 MB all-reduce over the world took %.2f ms sleeping between polls, "
                         "%.2f ms polling; WEFT_MPI_POLL_PAUSE_US overrides)",
                         how, from_environment ? " from WEFT_MPI_POLL_PAUSE_US" : "", sleeping_ms, polling_ms);
}

MpiPollChoice choose_mpi_poll_pause() {
  static std::once_flag once;
  static MpiPollChoice first;
  std::call_once(once, [] { first = measure(); });
  return first;
}

}  // namespace weft
