// Streams and events (see stream.h).
//
// Each device has one default stream, non-blocking (it never synchronizes with the legacy default
// stream), created on first use and shared by every thread of the process; it is never destroyed,
// because static destructors run after the CUDA runtime may have shut down. A thread's current
// stream of a device is that default unless the thread set another one (StreamGuard). Each stream
// slot holds the stream's id beside its handle, read when the slot is filled.
#include "runtime/cuda/stream.h"

#include <array>
#include <mutex>

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace weft::cuda {
namespace {

// Enough for any single host; device indices are checked against it.
constexpr int kMaxDevices = 64;

struct DefaultStreams {
  std::mutex mutex;
  std::array<cudaStream_t, kMaxDevices> streams{};
  std::array<uint64_t, kMaxDevices> ids{};
};

DefaultStreams& default_streams() {
  static DefaultStreams* streams = new DefaultStreams;  // leaked on purpose (see the file comment)
  return *streams;
}

// Per thread: the stream each device was set to (null: the device's default stream) and its id.
thread_local std::array<cudaStream_t, kMaxDevices> thread_streams{};
thread_local std::array<uint64_t, kMaxDevices> thread_stream_ids{};
thread_local std::array<bool, kMaxDevices> thread_stream_set{};

struct StreamAndId {
  cudaStream_t stream;
  uint64_t id;
};

StreamAndId default_stream(int device) {
  DefaultStreams& defaults = default_streams();
  std::lock_guard<std::mutex> lock(defaults.mutex);
  cudaStream_t& stream = defaults.streams[device];
  if (stream == nullptr) {
    set_device(device);
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    defaults.ids[device] = stream_id(stream);
  }
  return {stream, defaults.ids[device]};
}

struct DeviceCount {
  int count = 0;
  cudaError_t status = cudaSuccess;
};

// Cached: the answer cannot change within a process, and cudaGetDeviceCount is not free.
const DeviceCount& probed_device_count() {
  static const DeviceCount probed = [] {
    DeviceCount result;
    result.status = cudaGetDeviceCount(&result.count);
    if (result.status != cudaSuccess) {
      result.count = 0;
      cudaGetLastError();  // clear it so that it does not surface at an unrelated later check
    }
    return result;
  }();
  return probed;
}

}  // namespace

int device_count() { return probed_device_count().count; }

void check_device(int device) {
  const DeviceCount& probed = probed_device_count();
  if (probed.count == 0) {
    WEFT_FAIL("no CUDA device is available (cudaGetDeviceCount: ",
              probed.status == cudaSuccess ? "0 devices" : cudaGetErrorString(probed.status),
              "); cuda:", device, " was requested");
  }
  WEFT_CHECK(device >= 0 && device < probed.count && device < kMaxDevices, "cuda:", device,
             " requested, but only ", probed.count, " CUDA device(s) are visible");
}

cudaStream_t current_stream(int device) {
  check_device(device);
  if (thread_stream_set[device]) return thread_streams[device];
  return default_stream(device).stream;
}

uint64_t current_stream_id(int device) {
  check_device(device);
  if (thread_stream_set[device]) return thread_stream_ids[device];
  return default_stream(device).id;
}

void set_current_stream(int device, cudaStream_t stream) {
  check_device(device);  // before any CUDA call, so that a machine without a GPU gets that message
  set_current_stream(device, stream, stream_id(stream));
}

void set_current_stream(int device, cudaStream_t stream, uint64_t id) {
  check_device(device);
  thread_streams[device] = stream;
  thread_stream_ids[device] = id;
  thread_stream_set[device] = true;
}

uint64_t stream_id(cudaStream_t stream) {
  unsigned long long id = 0;
  WEFT_CUDA_CHECK(cudaStreamGetId(stream, &id));
  return static_cast<uint64_t>(id);
}

void set_device(int device) {
  int current = -1;
  // cudaGetDevice reads a thread-local value; it is much cheaper than a redundant cudaSetDevice.
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  WEFT_CUDA_CHECK(cudaSetDevice(device));
}

Stream::Stream(int device) : device_(device) {
  check_device(device);
  set_device(device);
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  id_ = stream_id(stream_);
}

Stream::~Stream() {
  if (stream_ == nullptr) return;
  // Caches may free or hand out again what this stream used once it is announced, so its work must
  // be over first. Errors are ignored: at process exit the runtime may already be gone.
  cudaStreamSynchronize(stream_);
  cudaGetLastError();
  announce_stream_retired(key());
  cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { WEFT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(bool timing) {
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) { WEFT_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void Event::wait(cudaStream_t stream) const { WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }

void Event::synchronize() const { WEFT_CUDA_CHECK(cudaEventSynchronize(event_)); }

float Event::elapsed_since(const Event& start) const {
  float milliseconds = 0.0f;
  WEFT_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.event_, event_));
  return milliseconds;
}

}  // namespace weft::cuda
