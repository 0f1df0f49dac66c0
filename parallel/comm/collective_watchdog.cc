// CollectiveWatchdog (see collective_watchdog.h).
//
// A round copies the tracked list under the lock, asks each handle is_done() with the lock
// dropped (a CUDA event query: no CUDA call is made under the lock), then takes the finished ones
// out of the list under the lock, and lets every reference go after unlocking.
#include "parallel/comm/collective_watchdog.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/clock.h"
#include "runtime/error.h"

namespace weft {

CollectiveWatchdog::CollectiveWatchdog(double timeout_ms, double poll_interval_ms, Check check,
                                       FailureHandler on_failure, ThreadSetup thread_setup)
    : timeout_ms_(timeout_ms), poll_interval_ms_(poll_interval_ms), check_(std::move(check)),
      on_failure_(std::move(on_failure)), thread_setup_(std::move(thread_setup)) {
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_condition_.notify_all();
  thread_.join();
  std::deque<Tracked> remaining;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remaining.swap(tracked_);
  }
  // `remaining` is released here, outside the lock.
}

void CollectiveWatchdog::track(CollectiveHandlePtr handle) {
  const double now = clock_ms();
  std::lock_guard<std::mutex> lock(mutex_);
  tracked_.push_back({std::move(handle), now});
}

size_t CollectiveWatchdog::tracked() {
  std::lock_guard<std::mutex> lock(mutex_);
  return tracked_.size();
}

std::string CollectiveWatchdog::poll() {
  std::vector<Tracked> snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot.assign(tracked_.begin(), tracked_.end());
  }
  std::string failure;
  std::unordered_set<const CollectiveHandle*> done;
  const double now = clock_ms();
  for (const Tracked& entry : snapshot) {
    try {
      if (entry.handle->is_done()) {
        done.insert(entry.handle.get());
        continue;
      }
    } catch (const std::exception& error) {
      failure = str(entry.handle->description(), " failed on the GPU: ", error.what());
      break;
    }
    if (now - entry.tracked_ms > timeout_ms_) {
      failure = str(entry.handle->description(), " did not complete within ", timeout_ms_ / 1000.0,
                    " s (WEFT_COMM_TIMEOUT_S)");
      break;
    }
  }
  std::vector<Tracked> finished;  // released after the lock below is dropped (see the header)
  if (!done.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto kept = std::stable_partition(tracked_.begin(), tracked_.end(),
                                      [&](const Tracked& entry) { return !done.contains(entry.handle.get()); });
    std::move(kept, tracked_.end(), std::back_inserter(finished));
    tracked_.erase(kept, tracked_.end());
  }
  finished.clear();
  snapshot.clear();
  if (failure.empty() && check_) failure = check_();
  return failure;
}

void CollectiveWatchdog::run() {
  if (thread_setup_) thread_setup_();
  const auto interval = std::chrono::duration<double, std::milli>(poll_interval_ms_);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      stop_condition_.wait_for(lock, interval, [&] { return stopping_; });
      if (stopping_) return;
    }
    const std::string failure = poll();
    if (failure.empty()) continue;
    if (on_failure_) on_failure_(failure);
    return;  // one report: production's handler ends the process; a test's returns
  }
}

}  // namespace weft
