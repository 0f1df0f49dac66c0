// StagedSendQueue: the thread that hands the pipeline's host-route messages of CUDA tensors to MPI
// once their copy to host memory has completed (pipeline_transport.h).
//
// Why a thread: a step-channel send of a CUDA tensor is copied into a page-locked buffer on a copy
// stream, behind the work that produced the tensor. Waiting for that copy on the issuing thread (what
// the host route did until 2026-12-05) holds the CUDA executor's only issuing thread until the
// device has run everything queued before the send: the GPU then runs dry while the host issues the
// next kernels, once per message. Here the issuing thread queues the send and goes on; this thread
// waits for the copy and posts MPI's send.
//
// Invariants:
// - Jobs run one at a time, in the order they were posted, on one thread started at the first post
//   (a transport that never sends a CUDA tensor starts none).
// - drain() returns once every job posted before it has run; it rethrows the first failure of any
//   job, then and at every later drain(). Jobs posted after a failure are not run (a broken transport sends nothing
//   more); the receiver's deadline names this rank.
// - The destructor runs no job that has not started; it waits for the one running.
// Thread-safe: post and drain may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace weft {

class StagedSendQueue {
 public:
  StagedSendQueue() = default;
  ~StagedSendQueue();
  StagedSendQueue(const StagedSendQueue&) = delete;
  StagedSendQueue& operator=(const StagedSendQueue&) = delete;

  // Queues `job` behind the jobs posted before it.
  void post(std::function<void()> job);
  // Blocks until every job posted so far has run; rethrows the first failure of any job.
  void drain();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> jobs_;
  uint64_t posted_ = 0;
  uint64_t finished_ = 0;  // jobs run (or passed over after a failure), in order
  bool stop_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // started by the first post()
};

}  // namespace weft
