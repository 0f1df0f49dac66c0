// Streams and events: the ordering primitives of the CUDA backend.
//
// Every kernel and copy of the backend runs on the calling thread's current stream of the tensor's
// device. By default that is one non-blocking stream per device created on first use (never the
// legacy default stream, which would serialize with everything). The executor (a later issue) sets
// other streams for communication with StreamGuard. Stream and Event are small RAII owners.
#pragma once

#include <cuda_runtime.h>

namespace weft::cuda {

// Number of visible devices (0 when there is no driver or no GPU; never throws).
int device_count();
// Throws weft::Error unless `device` is a visible device: "no CUDA device is available
// (cudaGetDeviceCount: <reason>)" on a machine without one, else the index and the count.
void check_device(int device);
// The current stream of `device` on this thread.
cudaStream_t current_stream(int device);
// Makes `stream` current for `device` on this thread.
void set_current_stream(int device, cudaStream_t stream);
// Makes `device` the CUDA runtime's current device on this thread (cheap when already current).
void set_device(int device);

class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

class Event {
 public:
  // Timing events are for measurements; others are cheaper and used for ordering.
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  // Makes `stream` wait for this event (no host blocking).
  void wait(cudaStream_t stream) const;
  void synchronize() const;
  // Milliseconds from `start` to this event (both timing events, both recorded and complete).
  float elapsed_since(const Event& start) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Sets the current stream of a device for a scope, restoring the previous one after.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream) : device_(device), previous_(current_stream(device)) {
    set_current_stream(device, stream);
  }
  ~StreamGuard() { set_current_stream(device_, previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

}  // namespace weft::cuda
