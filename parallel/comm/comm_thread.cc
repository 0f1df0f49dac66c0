#include "parallel/comm/comm_thread.h"

#include <atomic>
#include <cstdio>
#include <sstream>

#include "runtime/clock.h"
#include "runtime/error.h"

#if WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {

// --- HostCollectiveHandle ----------------------------------------------------------------------

void HostCollectiveHandle::run(std::function<void()>& task) {
  const double start = clock_ms();
  std::exception_ptr failure;
  try {
    task();
  } catch (...) {
    failure = std::current_exception();
  }
  // What the task holds (its tensors) goes before the handle is done: once it is, the waiter may
  // drop its own references, and the last one must not die on a comm thread — a tensor's autograd
  // history can hold the last copy of the very CommStream whose thread runs this.
  try {
    task = nullptr;
  } catch (...) {
    if (!failure) failure = std::current_exception();
  }
  const double end = clock_ms();
  std::lock_guard<std::mutex> lock(mutex_);
  start_ms_ = start;
  end_ms_ = end;
  failure_ = failure;
  done_ = true;
  done_condition_.notify_all();
}

void HostCollectiveHandle::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_condition_.wait(lock, [&] { return done_; });
  if (failure_) std::rethrow_exception(failure_);
}

void HostCollectiveHandle::wait(const CommStream& stream) {
  if (stream.is_cpu_thread()) {
    // The stream's later work starts after this completes (a failure is reported by wait() here).
    stream.thread()->post([self = shared_from_this()] {
      try {
        self->synchronize();
      } catch (...) {
      }
    });
  } else {
    synchronize();
  }
}

bool HostCollectiveHandle::is_done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

double HostCollectiveHandle::start_ms() {
  std::lock_guard<std::mutex> lock(mutex_);
  return start_ms_;
}

double HostCollectiveHandle::end_ms() {
  std::lock_guard<std::mutex> lock(mutex_);
  return end_ms_;
}

// --- CommThread --------------------------------------------------------------------------------

uint64_t next_comm_stream_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

CommThread::CommThread(std::string name)
    : name_(std::move(name)), id_(next_comm_stream_id()), thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    condition_.notify_all();
  }
  thread_.join();
}

void CommThread::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  WEFT_CHECK(!stopping_, "comm stream '", name_, "' is shutting down");
  tasks_.push_back(std::move(task));
  ++posted_;
  condition_.notify_all();
}

void CommThread::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = posted_;
  condition_.wait(lock, [&] { return finished_ >= target; });
}

void CommThread::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      condition_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and everything posted has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();  // tasks are wrapped by run_on_host_stream and never throw
    std::lock_guard<std::mutex> lock(mutex_);
    ++finished_;
    condition_.notify_all();
  }
}

// --- Running on host streams -------------------------------------------------------------------

CollectiveHandlePtr run_on_host_stream(const CommStream& stream, std::string description, int64_t bytes,
                                       std::function<void()> task) {
  WEFT_CHECK(!stream.is_cuda(), description, ": runs on the CPU and cannot run on CUDA stream ", stream.name(),
             "; use the caller stream or a CommStream::cpu");
  auto handle = std::make_shared<HostCollectiveHandle>(std::move(description), bytes);
  if (stream.is_caller()) {
    handle->run(task);
  } else {
    stream.thread()->post([handle, task = std::move(task)]() mutable { handle->run(task); });
  }
  return handle;
}

// --- CommStream --------------------------------------------------------------------------------

CommStream CommStream::caller(const std::string& name) {
  CommStream stream;
  stream.id_ = next_comm_stream_id();
  stream.name_ = name;
  return stream;
}

CommStream CommStream::cpu(const std::string& name) {
  CommStream stream;
  stream.kind_ = Kind::kCpuThread;
  stream.thread_ = std::make_shared<CommThread>(name);
  stream.id_ = stream.thread_->id();
  stream.name_ = name;
  return stream;
}

CommStream CommStream::cuda(CUstream_st* stream, int device) {
  WEFT_CHECK(device >= 0, "CommStream::cuda: device must be a CUDA device index, got ", device);
  CommStream result;
  result.kind_ = Kind::kCuda;
  result.cuda_stream_ = stream;
  result.cuda_device_ = device;
  return result;
}

std::string CommStream::name() const {
  switch (kind_) {
    case Kind::kCaller: return name_.empty() ? "caller" : name_;
    case Kind::kCpuThread: return name_;
    case Kind::kCuda: {
      std::ostringstream text;
      text << "cuda:" << cuda_device_ << " stream " << static_cast<const void*>(cuda_stream_);
      return text.str();
    }
  }
  return "?";
}

CollectiveHandlePtr CommStream::enqueue(const std::string& description, std::function<void()> task) const {
  return run_on_host_stream(*this, description, 0, std::move(task));
}

void CommStream::synchronize() const {
  if (kind_ == Kind::kCpuThread) {
    thread_->drain();
  } else if (kind_ == Kind::kCuda) {
#if WEFT_HAVE_CUDA
    cuda::set_device(cuda_device_);
    cudaStream_t stream = cuda_stream_ ? cuda_stream_ : cuda::current_stream(cuda_device_);
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
    WEFT_FAIL("CommStream::synchronize: this build of weft has no CUDA");
#endif
  }
}

}  // namespace weft
