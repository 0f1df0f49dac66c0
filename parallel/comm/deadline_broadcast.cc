// broadcast_before_deadline (see deadline_broadcast.h).
#include "parallel/comm/deadline_broadcast.h"

#include <algorithm>
#include <thread>

#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;

// Outside the range weft's other point-to-point messages use (tag 0).
constexpr int kArrivalTag = 0x5745;   // "WE"
constexpr int kHandOverTag = 0x5746;  // "WF"

// Polls `requests` until all are done or `deadline` passes; returns the indices of those still
// pending (empty: all done).
std::vector<size_t> wait_until(std::vector<MPI_Request>& requests, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(5);
  for (int polls = 0;; ++polls) {
    std::vector<size_t> pending;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      {
        MpiCallLock lock;
        WEFT_MPI_CHECK(MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE));
      }
      if (!done) pending.push_back(i);
    }
    if (pending.empty() || Clock::now() > deadline) return pending;
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(200));
    }
  }
}

std::string world_rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += str(text.empty() ? "" : ", ", rank);
  return text;
}

// abort_all with `failure` and what is known of `world_ranks`' processes on this host, or else
// `unknown`.
[[noreturn]] void abort_with_peers(const std::string& failure, const std::vector<int>& world_ranks,
                                   const char* unknown) {
  const std::string gone = describe_failed_peers(world_ranks);
  abort_all(str(failure, "; ", gone.empty() ? unknown : gone));
}

}  // namespace

void broadcast_before_deadline(MPI_Comm comm, void* data, int bytes, Clock::time_point deadline,
                               double timeout_seconds, const std::string& description,
                               const std::vector<int>& world_ranks) {
  int rank = 0;
  int size = 1;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    WEFT_MPI_CHECK(MPI_Comm_size(comm, &size));
  }
  if (size == 1) return;
  if (rank == 0) {
    std::vector<char> arrivals(static_cast<size_t>(size));
    std::vector<MPI_Request> requests(static_cast<size_t>(size), MPI_REQUEST_NULL);
    {
      MpiCallLock lock;
      for (int peer = 1; peer < size; ++peer) {
        WEFT_MPI_CHECK(MPI_Irecv(&arrivals[static_cast<size_t>(peer)], 1, MPI_CHAR, peer, kArrivalTag, comm,
                                 &requests[static_cast<size_t>(peer)]));
      }
    }
    const std::vector<size_t> missing = wait_until(requests, deadline);
    if (!missing.empty()) {
      std::vector<int> missing_ranks;
      for (size_t peer : missing) missing_ranks.push_back(world_ranks[peer]);
      abort_with_peers(str(description, ": world rank", missing_ranks.size() > 1 ? "s " : " ",
                           world_rank_list(missing_ranks), " did not arrive within ", timeout_seconds,
                           " s (WEFT_COMM_TIMEOUT_S)"),
                       missing_ranks, "none of them has exited or stopped on this host: stuck before this point, or "
                                      "on another host");
    }
    {
      MpiCallLock lock;
      for (int peer = 1; peer < size; ++peer) {
        WEFT_MPI_CHECK(
            MPI_Isend(data, bytes, MPI_BYTE, peer, kHandOverTag, comm, &requests[static_cast<size_t>(peer)]));
      }
    }
    if (!wait_until(requests, deadline).empty()) {
      abort_with_peers(str(description, ": every rank arrived, but handing the bytes over did not complete within ",
                           timeout_seconds, " s (WEFT_COMM_TIMEOUT_S)"),
                       world_ranks, "no rank of the group on this host has exited or stopped");
    }
    return;
  }
  char arrived = 1;
  std::vector<MPI_Request> requests(2, MPI_REQUEST_NULL);
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Isend(&arrived, 1, MPI_CHAR, 0, kArrivalTag, comm, &requests[0]));
    WEFT_MPI_CHECK(MPI_Irecv(data, bytes, MPI_BYTE, 0, kHandOverTag, comm, &requests[1]));
  }
  // Later than rank 0, whose message names the ranks that did not arrive (see the header).
  if (!wait_until(requests, deadline + std::chrono::seconds(2)).empty()) {
    abort_with_peers(str(description, ": world rank ", world_ranks[0], " (the group's rank 0) did not hand it over "
                         "within ", timeout_seconds, " s (WEFT_COMM_TIMEOUT_S): it, or another rank of the group, "
                         "has not arrived"),
                     world_ranks, "no rank of the group on this host has exited or stopped");
  }
}

}  // namespace weft
