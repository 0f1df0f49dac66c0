// Streams and events: the ordering primitives of the CUDA backend.
//
// Every kernel and copy of the backend runs on the calling thread's current stream of the tensor's
// device. By default that is one non-blocking stream per device created on first use (never the
// legacy default stream, which would serialize with everything). The executor sets other streams
// for communication with StreamGuard. Stream and Event are small RAII owners.
//
// Stream identity: per-stream caches key by stream_id(), never by the cudaStream_t, because CUDA
// hands a destroyed stream's handle out again (runtime/stream_retirement.h says what goes wrong).
// A thread's current stream id is read once, when the stream is made current, so that the hot
// path (every allocation) makes no CUDA call for it. A Stream's destructor waits for its work and
// announces the stream retired before destroying it, so that caches drop its entries.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/stream_retirement.h"

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
// The same, with `stream`'s id already known (stream_id(stream)).
void set_current_stream(int device, cudaStream_t stream, uint64_t id);
// `stream`'s id, unique for the life of the process (cudaStreamGetId; CUDA 12 and later).
uint64_t stream_id(cudaStream_t stream);
// The id of current_stream(device), as read when it was made current (no CUDA call).
uint64_t current_stream_id(int device);
// {device, current_stream_id(device)}: the key of the calling thread's current stream.
inline StreamKey current_stream_key(int device) { return {device, current_stream_id(device)}; }
// Makes `device` the CUDA runtime's current device on this thread (cheap when already current).
void set_device(int device);

class Stream {
 public:
  explicit Stream(int device);
  // Waits for the stream's work, announces it retired (runtime/stream_retirement.h), destroys it.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  uint64_t id() const { return id_; }
  StreamKey key() const { return {device_, id_}; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  uint64_t id_ = 0;
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
  StreamGuard(int device, cudaStream_t stream)
      : device_(device), previous_(current_stream(device)), previous_id_(current_stream_id(device)) {
    set_current_stream(device, stream);
  }
  ~StreamGuard() { set_current_stream(device_, previous_, previous_id_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
  uint64_t previous_id_;
};

}  // namespace weft::cuda
