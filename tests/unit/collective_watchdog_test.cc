// CollectiveWatchdog with fake handles, no GPU: finished handles are let go outside the
// watchdog's lock and on its thread, unfinished ones are held, and a handle that fails, one past
// its deadline, or the group's own check is reported once, by name.
//
// The fake's destructor asks the watchdog how many handles it tracks, which takes its lock, from a
// second thread with a time limit: a release under the lock shows as a probe that cannot get in
// within 2 s (and not as a test that hangs: the probe is joined by the test, once the lock is free).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/collective_watchdog.h"
#include "runtime/error.h"

namespace weft {
namespace {

using namespace std::chrono_literals;

// What the fake saw when it was destroyed.
struct Release {
  std::atomic<bool> released{false};
  std::atomic<bool> lock_was_free{false};
  std::thread::id thread;
  std::thread probe;  // joined by the test (join_probe), never by the destructor that started it
  void join_probe() {
    if (probe.joinable()) probe.join();
  }
};

class FakeHandle final : public CollectiveHandle {
 public:
  FakeHandle(std::string description, CollectiveWatchdog** watchdog, std::shared_ptr<Release> release)
      : CollectiveHandle(std::move(description), 0), watchdog_(watchdog), release_(std::move(release)) {}
  ~FakeHandle() override {
    if (*watchdog_ != nullptr) {
      // Another thread must be able to take the watchdog's lock now.
      auto entered = std::make_shared<std::promise<void>>();
      std::future<void> done = entered->get_future();
      release_->probe = std::thread([watchdog = *watchdog_, entered] {
        watchdog->tracked();
        entered->set_value();
      });
      release_->lock_was_free = done.wait_for(2s) == std::future_status::ready;
    }
    release_->thread = std::this_thread::get_id();
    release_->released = true;
  }

  void wait() override {}
  void wait(const CommStream&) override {}
  void synchronize() override {}
  bool is_done() override {
    if (fails) throw Error("device-side assert (fake)");
    return done;
  }

  std::atomic<bool> done{false};
  std::atomic<bool> fails{false};

 private:
  CollectiveWatchdog** watchdog_;
  std::shared_ptr<Release> release_;
};

// Records the failures the watchdog reports.
struct Failures {
  std::mutex mutex;
  std::vector<std::string> seen;
  void add(const std::string& failure) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.push_back(failure);
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return seen;
  }
};

template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds limit = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return condition();
}

TEST(CollectiveWatchdog, ReleasesAFinishedHandleOutsideItsLockOnItsOwnThread) {
  CollectiveWatchdog* pointer = nullptr;
  Failures failures;
  CollectiveWatchdog watchdog(/*timeout_ms=*/60000, /*poll_interval_ms=*/5, nullptr,
                              [&](const std::string& failure) { failures.add(failure); });
  pointer = &watchdog;
  auto release = std::make_shared<Release>();
  {
    auto handle = std::make_shared<FakeHandle>("all_reduce(sum) of f32[4] cuda:0 on dp", &pointer, release);
    watchdog.track(handle);
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(watchdog.tracked(), 1u) << "not done: held";
    handle->done = true;
  }  // the watchdog now holds the last reference
  ASSERT_TRUE(eventually([&] { return release->released.load(); }));
  release->join_probe();
  EXPECT_TRUE(release->lock_was_free) << "the handle (and its tensors) was released under the watchdog's lock";
  EXPECT_NE(release->thread, std::this_thread::get_id()) << "released on the watchdog's thread";
  EXPECT_EQ(watchdog.tracked(), 0u);
  EXPECT_TRUE(failures.get().empty());
  pointer = nullptr;
}

TEST(CollectiveWatchdog, PollReleasesFinishedHandlesAfterUnlockingAndKeepsTheOthers) {
  CollectiveWatchdog* pointer = nullptr;
  // The thread never polls (an hour between rounds): poll() runs on this thread.
  CollectiveWatchdog watchdog(60000, 3.6e6, nullptr, nullptr);
  pointer = &watchdog;
  auto finished_release = std::make_shared<Release>();
  auto running_release = std::make_shared<Release>();
  auto finished = std::make_shared<FakeHandle>("broadcast(root 0)", &pointer, finished_release);
  auto running = std::make_shared<FakeHandle>("all_gather", &pointer, running_release);
  watchdog.track(finished);
  watchdog.track(running);
  finished->done = true;
  finished.reset();
  EXPECT_EQ(watchdog.poll(), "");
  finished_release->join_probe();
  EXPECT_TRUE(finished_release->released);
  EXPECT_TRUE(finished_release->lock_was_free);
  EXPECT_EQ(finished_release->thread, std::this_thread::get_id());
  EXPECT_FALSE(running_release->released) << "an unfinished collective keeps its tensors";
  EXPECT_EQ(watchdog.tracked(), 1u);
  running->done = true;
  running.reset();
  EXPECT_EQ(watchdog.poll(), "");
  running_release->join_probe();
  EXPECT_TRUE(running_release->released);
  EXPECT_EQ(watchdog.tracked(), 0u);
  pointer = nullptr;
}

TEST(CollectiveWatchdog, ACollectivePastItsDeadlineIsReportedOnceByName) {
  CollectiveWatchdog* pointer = nullptr;
  Failures failures;
  {
    CollectiveWatchdog watchdog(/*timeout_ms=*/50, /*poll_interval_ms=*/5, nullptr,
                                [&](const std::string& failure) { failures.add(failure); });
    auto handle = std::make_shared<FakeHandle>("all_reduce(average) of bf16[1024] cuda:0 on dp (world ranks 0, 1)",
                                               &pointer, std::make_shared<Release>());
    watchdog.track(handle);
    ASSERT_TRUE(eventually([&] { return !failures.get().empty(); }));
    std::this_thread::sleep_for(50ms);  // no second report
  }
  const std::vector<std::string> seen = failures.get();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "all_reduce(average) of bf16[1024] cuda:0 on dp (world ranks 0, 1) did not complete within "
                     "0.05 s (WEFT_COMM_TIMEOUT_S)");
}

TEST(CollectiveWatchdog, AHandleThatFailsOnTheDeviceIsReported) {
  CollectiveWatchdog* pointer = nullptr;
  Failures failures;
  CollectiveWatchdog watchdog(60000, 5, nullptr, [&](const std::string& failure) { failures.add(failure); });
  auto handle = std::make_shared<FakeHandle>("reduce_scatter(sum)", &pointer, std::make_shared<Release>());
  handle->fails = true;
  watchdog.track(handle);
  ASSERT_TRUE(eventually([&] { return !failures.get().empty(); }));
  EXPECT_EQ(failures.get()[0], "reduce_scatter(sum) failed on the GPU: device-side assert (fake)");
}

TEST(CollectiveWatchdog, TheGroupsCheckRunsEveryRoundAndItsFailureIsReported) {
  std::atomic<int> rounds{0};
  Failures failures;
  CollectiveWatchdog watchdog(
      60000, 5,
      [&]() -> std::string { return ++rounds < 3 ? "" : "NCCL reported an asynchronous error on dp: remote error"; },
      [&](const std::string& failure) { failures.add(failure); });
  ASSERT_TRUE(eventually([&] { return !failures.get().empty(); }));
  EXPECT_EQ(failures.get()[0], "NCCL reported an asynchronous error on dp: remote error");
  EXPECT_EQ(rounds.load(), 3);
}

// The thread setup (the NCCL group's: its GPU made current) runs on the watchdog's own thread,
// once, before the first round's check.
TEST(CollectiveWatchdog, ItsThreadSetupRunsOnItsThreadBeforeTheFirstRound) {
  std::mutex mutex;
  std::vector<std::string> events;
  std::thread::id setup_thread, check_thread;
  auto record = [&](const std::string& event, std::thread::id* thread) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(event);
    *thread = std::this_thread::get_id();
  };
  {
    CollectiveWatchdog watchdog(
        60000, 5,
        [&]() -> std::string {
          record("check", &check_thread);
          return "";
        },
        nullptr, [&] { record("setup", &setup_thread); });
    ASSERT_TRUE(eventually([&] {
      std::lock_guard<std::mutex> lock(mutex);
      return events.size() >= 3;
    }));
  }
  EXPECT_EQ(events[0], "setup");
  EXPECT_EQ(std::count(events.begin(), events.end(), "setup"), 1);
  EXPECT_EQ(setup_thread, check_thread);
  EXPECT_NE(setup_thread, std::this_thread::get_id());
}

TEST(CollectiveWatchdog, DestroyingItReleasesWhatItStillHolds) {
  CollectiveWatchdog* pointer = nullptr;
  auto release = std::make_shared<Release>();
  {
    CollectiveWatchdog watchdog(60000, 3.6e6, nullptr, nullptr);
    watchdog.track(std::make_shared<FakeHandle>("barrier", &pointer, release));
    EXPECT_FALSE(release->released);
  }
  EXPECT_TRUE(release->released);
}

}  // namespace
}  // namespace weft
