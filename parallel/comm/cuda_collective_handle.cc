#if WEFT_HAVE_CUDA

#include "parallel/comm/cuda_collective_handle.h"

#include <mutex>

#include "parallel/comm/comm_thread.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/clock.h"
#include "runtime/error.h"

namespace weft {
namespace {

// A timing event recorded on `device` and the clock_ms() reading taken when it completed.
struct ClockReference {
  std::unique_ptr<cuda::Event> event;
  double host_ms = 0.0;
};

const ClockReference& clock_reference(int device) {
  static std::mutex mutex;
  // Never destroyed: its events must not outlive the CUDA runtime at exit.
  static auto* references = new std::vector<std::unique_ptr<ClockReference>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (references->size() <= static_cast<size_t>(device)) references->resize(static_cast<size_t>(device) + 1);
  auto& reference = (*references)[static_cast<size_t>(device)];
  if (!reference) {
    cuda::set_device(device);
    reference = std::make_unique<ClockReference>();
    reference->event = std::make_unique<cuda::Event>(true);
    // Recorded on a fresh, empty stream: it completes at once, so the host time read right after
    // its completion is its time.
    cuda::Stream stream(device);
    reference->event->record(stream.get());
    reference->event->synchronize();
    reference->host_ms = clock_ms();
  }
  return *reference;
}

}  // namespace

CudaCollectiveHandle::CudaCollectiveHandle(std::string description, int64_t bytes, int device, cudaStream_t stream,
                                           std::vector<Tensor> keep_alive)
    : CollectiveHandle(std::move(description), bytes), device_(device), stream_(stream),
      keep_alive_(std::move(keep_alive)) {
  clock_reference(device_);
  cuda::set_device(device_);
  start_.record(stream_);
}

void CudaCollectiveHandle::record_end() { end_.record(stream_); }

void CudaCollectiveHandle::wait() {
  cuda::set_device(device_);
  end_.wait(cuda::current_stream(device_));
}

void CudaCollectiveHandle::wait(const CommStream& stream) {
  if (stream.is_cuda()) {
    cuda::set_device(device_);
    end_.wait(stream.cuda_stream() ? stream.cuda_stream() : cuda::current_stream(stream.cuda_device()));
  } else if (stream.is_cpu_thread()) {
    stream.thread()->post([self = shared_from_this()] {
      try {
        self->synchronize();
      } catch (...) {
      }
    });
  } else {
    wait();
  }
}

void CudaCollectiveHandle::synchronize() { end_.synchronize(); }

bool CudaCollectiveHandle::is_done() {
  const cudaError_t status = cudaEventQuery(end_.get());
  if (status == cudaErrorNotReady) return false;
  WEFT_CUDA_CHECK(status);
  return true;
}

// The start event precedes the end event on the stream, so both have completed once is_done().
double CudaCollectiveHandle::start_ms() {
  if (!is_done()) return -1.0;
  const ClockReference& reference = clock_reference(device_);
  return reference.host_ms + start_.elapsed_since(*reference.event);
}

double CudaCollectiveHandle::end_ms() {
  if (!is_done()) return -1.0;
  const ClockReference& reference = clock_reference(device_);
  return reference.host_ms + end_.elapsed_since(*reference.event);
}

}  // namespace weft

#endif  // WEFT_HAVE_CUDA
