// StagedSendQueue (staged_send_queue.h).
#include "parallel/pipeline/staged_send_queue.h"

#include <pthread.h>

namespace weft {

StagedSendQueue::~StagedSendQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    jobs_.clear();
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StagedSendQueue::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
    ++posted_;
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
      pthread_setname_np(thread_.native_handle(), "weft-pp-sends");
    }
  }
  changed_.notify_all();
}

void StagedSendQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t jobs = posted_;
  changed_.wait(lock, [&] { return finished_ >= jobs || failure_ != nullptr; });
  if (failure_ != nullptr) std::rethrow_exception(failure_);
}

void StagedSendQueue::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    if (failure_ != nullptr) {  // after a failure nothing more is sent
      ++finished_;
      continue;
    }
    lock.unlock();
    std::exception_ptr failure;
    try {
      job();
    } catch (...) {
      failure = std::current_exception();
    }
    job = nullptr;  // what it holds goes before drain() can return
    lock.lock();
    ++finished_;
    if (failure != nullptr && failure_ == nullptr) failure_ = failure;
    changed_.notify_all();
  }
}

}  // namespace weft
