// StagedSendQueue (parallel/pipeline/staged_send_queue.h): the host route's sends of CUDA tensors
// are handed to MPI on a thread of their own, in the order posted; finishing one step's sends waits
// for those only; a failure reaches the caller and stops every later send.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "parallel/pipeline/staged_send_queue.h"

namespace weft {
namespace {

TEST(StagedSendQueue, RunsJobsInTheOrderPostedOffTheCallersThread) {
  StagedSendQueue queue;
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 1; i <= 50; ++i) {
    EXPECT_EQ(queue.post([&, i] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }), static_cast<uint64_t>(i));
  }
  queue.drain(50);
  std::vector<int> expected;
  for (int i = 1; i <= 50; ++i) expected.push_back(i);
  EXPECT_EQ(order, expected);
  for (const std::thread::id& thread : threads) {
    EXPECT_NE(thread, std::this_thread::get_id());
    EXPECT_EQ(thread, threads.front()) << "one thread runs every job";
  }
}

// With steps in flight the next step's sends are queued before this step's are finished; their
// copies wait for the next step's compute. drain(n) must not wait for them.
TEST(StagedSendQueue, DrainWaitsForTheFirstJobsOnly) {
  StagedSendQueue queue;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  queue.post([&] { ++ran; });
  queue.post([&] { ++ran; });
  queue.post([&, released] {
    released.wait();  // a later step's copy, not done yet
    ++ran;
  });
  queue.drain(2);
  EXPECT_GE(ran.load(), 2);
  EXPECT_LT(ran.load(), 3) << "the third job cannot have run before it was released";
  auto all = std::async(std::launch::async, [&] { queue.drain(3); });
  EXPECT_EQ(all.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
      << "drain(3) returned while the third job was still waiting";
  release.set_value();
  all.get();
  EXPECT_EQ(ran.load(), 3);
  queue.drain(0);  // nothing asked: at once
}

TEST(StagedSendQueue, AFailureReachesEveryLaterDrainAndStopsLaterJobs) {
  StagedSendQueue queue;
  std::atomic<int> ran{0};
  queue.post([&] { ++ran; });
  queue.post([] { throw std::runtime_error("MPI_Isend failed"); });
  queue.post([&] { ++ran; });
  try {
    queue.drain(1);  // the first job only: it may return before the failure, or rethrow it
  } catch (const std::runtime_error&) {
  }
  EXPECT_THROW(queue.drain(2), std::runtime_error);
  EXPECT_THROW(queue.drain(3), std::runtime_error);
  queue.post([&] { ++ran; });
  EXPECT_THROW(queue.drain(4), std::runtime_error);
  EXPECT_EQ(ran.load(), 1) << "a job after the failure ran: a broken transport must send nothing more";
}

TEST(StagedSendQueue, DestructionRunsNoJobThatHasNotStarted) {
  std::atomic<int> ran{0};
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  {
    StagedSendQueue queue;
    queue.post([&, released] {
      started.set_value();
      released.wait();  // until the queued job below is dropped, unrun
      ++ran;
    });
    // Releases the first job when this job is destroyed: by the destructor dropping it, or after it
    // ran, which cannot happen while the first job holds the queue's thread.
    std::shared_ptr<void> on_drop(nullptr, [&release](void*) { release.set_value(); });
    queue.post([&ran, on_drop] { ran += 100; });
    on_drop.reset();
    started.get_future().wait();
  }
  EXPECT_EQ(ran.load(), 1) << "the running job finishes, the queued one is dropped";
}

}  // namespace
}  // namespace weft
