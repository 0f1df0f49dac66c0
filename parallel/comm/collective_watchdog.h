// CollectiveWatchdog: a thread that watches the collectives a process group has queued and reports
// the first one that fails or outlives the deadline.
//
// The NCCL backend's collectives return at once and run on the GPU, so nothing else would notice
// one that never ends (a peer that died leaves its kernel spinning). The group tracks every handle
// it returns; every `poll_interval_ms` the watchdog asks each tracked handle is_done() (which never
// blocks), lets go of the finished ones, and runs the group's own `check` (NCCL:
// ncclCommGetAsyncError on every communicator). The first failure found — a handle whose is_done()
// throws (its GPU work failed), one not done `timeout_ms` after it was tracked, or a text the check
// returns — goes to `on_failure` (NCCL: describe the peers, ncclCommAbort, abort_all), once; the
// watchdog stops polling after it.
//
// Invariants:
// - A tracked handle stays referenced until it is done (or the watchdog is destroyed), so the
//   tensors it keeps alive are never freed under a running collective.
// - Finished handles are released after the watchdog's lock is dropped: the handle can hold the
//   last reference to a collective's tensors, and freeing a CUDA tensor takes the caching
//   allocator's lock and calls CUDA. Under the lock that track() takes, that would stall every
//   thread queueing a collective behind a CUDA free, and order the allocator's lock after ours.
// - `check` and `on_failure` run without the lock held, on the watchdog's thread (or on the
//   caller's, for poll()).
// - `thread_setup`, when given, runs first on the watchdog's thread: the NCCL group makes its GPU
//   the thread's current device there. Otherwise the thread's first CUDA call (an event query) or a
//   free that restores "the previous device" would create a context on GPU 0 from a rank that
//   uses another GPU (half a GiB of GPU 0 per rank).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/comm/process_group.h"

namespace weft {

class CollectiveWatchdog {
 public:
  // Returns "" when all is well, else what went wrong (the watchdog adds nothing to it).
  using Check = std::function<std::string()>;
  // Receives the failure; may end the process (abort_all) or return (tests).
  using FailureHandler = std::function<void(const std::string& failure)>;
  // Prepares the watchdog's thread before its first round.
  using ThreadSetup = std::function<void()>;

  // Starts the thread. `timeout_ms` is the deadline of each tracked handle, counted from track().
  CollectiveWatchdog(double timeout_ms, double poll_interval_ms, Check check, FailureHandler on_failure,
                     ThreadSetup thread_setup = nullptr);
  // Stops and joins the thread, then releases the handles still tracked (on the caller's thread).
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Watches `handle` from now on (its deadline starts now).
  void track(CollectiveHandlePtr handle);
  // How many handles are tracked (not yet seen done).
  size_t tracked();

  // One round on the caller's thread, as the watchdog's thread runs it: releases the finished
  // handles (after unlocking), runs the check, and returns the first failure ("" when none). It does
  // not call on_failure; the thread does, with what this returns.
  std::string poll();

 private:
  struct Tracked {
    CollectiveHandlePtr handle;
    double tracked_ms;  // clock_ms() at track()
  };
  void run();

  const double timeout_ms_;
  const double poll_interval_ms_;
  const Check check_;
  const FailureHandler on_failure_;
  const ThreadSetup thread_setup_;

  std::mutex mutex_;  // guards tracked_ and stopping_
  std::deque<Tracked> tracked_;
  bool stopping_ = false;
  std::condition_variable stop_condition_;
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace weft
