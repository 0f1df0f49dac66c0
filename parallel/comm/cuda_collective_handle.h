// CudaCollectiveHandle: the completion of a collective queued on a CUDA stream.
//
// Two timing events bracket the work on its stream (record_start at construction, record_end after
// the work is queued). wait() makes the caller's current stream wait for the end event without
// blocking the host; is_done() queries it; start_ms()/end_ms() convert the events to clock_ms() through
// a per-device reference event whose host time was read once (so GPU and host timings share one
// clock; the float milliseconds of cudaEventElapsedTime keep about 0.25 ms resolution after an hour).
// The handle holds the tensors it was given until it is destroyed; NCCL groups keep handles until
// the GPU has finished them, so a tensor is never freed under a running collective.
#pragma once

#if WEFT_HAVE_CUDA

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/cuda/stream.h"

namespace weft {

class CudaCollectiveHandle final : public CollectiveHandle,
                                   public std::enable_shared_from_this<CudaCollectiveHandle> {
 public:
  // Records the start event on `stream` of `device` now.
  CudaCollectiveHandle(std::string description, int64_t bytes, int device, cudaStream_t stream,
                       std::vector<Tensor> keep_alive);
  // Records the end event; call once, after the work is queued on the stream.
  void record_end();

  void wait() override;
  void wait(const CommStream& stream) override;
  void synchronize() override;
  bool is_done() override;
  // Negative until the end event has completed.
  double start_ms() override;
  double end_ms() override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // The timing events around the work: exact intervals against another event of the device (a
  // step's start), where start_ms()/end_ms() go through the clock reference.
  const cuda::Event& start_event() const { return start_; }
  const cuda::Event& end_event() const { return end_; }

 private:
  int device_;
  cudaStream_t stream_;
  cuda::Event start_{true};
  cuda::Event end_{true};
  std::vector<Tensor> keep_alive_;
};

}  // namespace weft

#endif  // WEFT_HAVE_CUDA
