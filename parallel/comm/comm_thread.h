// CommThread: the CPU backend's communication stream, and the completion of host-run work.
//
// A CommThread owns one thread that runs posted tasks one at a time in the order they were posted,
// so the thread that posts them (compute) runs on meanwhile: on the CPU, overlap of communication
// and compute is real. HostCollectiveHandle is the completion of one such task (or of one run at
// once on the caller's thread): start_ms()/end_ms() are clock_ms() when the task began and ended
// (negative until it has), and an exception the task threw is rethrown by wait() and synchronize().
//
// run_on_host_stream() is how a CPU backend runs a collective: now on the caller stream, queued on
// a CommThread stream; CUDA streams are refused (they belong to the NCCL backend).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/comm/process_group.h"

namespace weft {

class HostCollectiveHandle final : public CollectiveHandle,
                                   public std::enable_shared_from_this<HostCollectiveHandle> {
 public:
  HostCollectiveHandle(std::string description, int64_t bytes)
      : CollectiveHandle(std::move(description), bytes) {}

  void wait() override { synchronize(); }
  void wait(const CommStream& stream) override;
  void synchronize() override;
  bool is_done() override;
  double start_ms() override;
  double end_ms() override;

  // Runs `task`, recording its timing and its failure, then marks the handle done.
  // Runs `task`, releases it (its captures), then marks the handle done.
  void run(std::function<void()>& task);

 private:
  std::mutex mutex_;
  std::condition_variable done_condition_;
  bool done_ = false;
  std::exception_ptr failure_;
  double start_ms_ = -1.0;  // set with done_
  double end_ms_ = -1.0;
};

class CommThread {
 public:
  explicit CommThread(std::string name);
  // Finishes what was posted, then joins the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  const std::string& name() const { return name_; }
  // Unique in the process among comm stream ids (next_comm_stream_id), from 1.
  uint64_t id() const { return id_; }
  // Queues `task` after everything posted before it.
  void post(std::function<void()> task);
  // Blocks until everything posted so far has run.
  void drain();

 private:
  void loop();

  std::string name_;
  uint64_t id_;
  std::mutex mutex_;
  std::condition_variable condition_;
  std::deque<std::function<void()>> tasks_;
  uint64_t posted_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

// A new comm stream identity (1, 2, ...): CommThreads and named caller streams take one each.
uint64_t next_comm_stream_id();

// Runs `task` on a caller or CommThread stream (see the file comment) and returns its handle.
CollectiveHandlePtr run_on_host_stream(const CommStream& stream, std::string description, int64_t bytes,
                                       std::function<void()> task);

}  // namespace weft
