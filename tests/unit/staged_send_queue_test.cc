// StagedSendQueue (parallel/pipeline/staged_send_queue.h): the host route's sends of CUDA tensors
// are handed to MPI on a thread of their own, in the order posted; finishing the sends waits for
// every one of them; a failure reaches the caller and stops every later send.
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
    queue.post([&, i] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  queue.drain();
  std::vector<int> expected;
  for (int i = 1; i <= 50; ++i) expected.push_back(i);
  EXPECT_EQ(order, expected);
  for (const std::thread::id& thread : threads) {
    EXPECT_NE(thread, std::this_thread::get_id());
    EXPECT_EQ(thread, threads.front()) << "one thread runs every job";
  }
}

// A send whose copy has not completed holds drain() until it has been handed over.
TEST(StagedSendQueue, DrainWaitsForAJobStillWaitingForItsCopy) {
  StagedSendQueue queue;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  queue.post([&] { ++ran; });
  queue.post([&, released] {
    released.wait();  // its copy, not done yet
    ++ran;
  });
  auto drained = std::async(std::launch::async, [&] { queue.drain(); });
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
      << "drain() returned while the second job was still waiting";
  EXPECT_LT(ran.load(), 2);
  release.set_value();
  drained.get();
  EXPECT_EQ(ran.load(), 2);
  queue.drain();  // nothing left: at once
}

TEST(StagedSendQueue, AFailureReachesEveryLaterDrainAndStopsLaterJobs) {
  StagedSendQueue queue;
  std::atomic<int> ran{0};
  queue.post([&] { ++ran; });
  queue.post([] { throw std::runtime_error("MPI_Isend failed"); });
  queue.post([&] { ++ran; });
  EXPECT_THROW(queue.drain(), std::runtime_error);
  EXPECT_THROW(queue.drain(), std::runtime_error);
  queue.post([&] { ++ran; });
  EXPECT_THROW(queue.drain(), std::runtime_error);
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
