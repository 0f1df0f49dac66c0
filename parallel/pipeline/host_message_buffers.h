// HostMessageBuffers: host memory, used again message after message, that the pipeline's host route
// stages CUDA tensors in (parallel.pp_transport host: the tensor copied to host memory, sent by MPI,
// copied to the receiver's device; pipeline_transport.h).
//
// Why: on the H200 machine, MPI between buffers allocated for each message moved 0.57 GB/s at 8 MB
// and the same exchange between buffers used again 4.4-4.7 GB/s; a copy from the device into fresh
// pageable memory 1.2-9 GB/s and into page-locked memory 27-53 GB/s (tools/cuda_host_route_benchmark,
// docs/performance.md, 2026-12-05). So a message's host buffer is page-locked
// (Tensor::empty_pinned) and, once its message is done, kept for the next message of its dtype and
// shape: a pipeline sends the same shapes every micro-batch, so after the first step no message
// allocates. (On that machine the route's own speed did not move with these buffers alone while
// weft's MPI waits slept between polls; mpi_process_group.h says why they no longer do on GPUs.)
//
// A received message goes to its device straight from its buffer (upload_and_release): a CUDA copy
// from page-locked memory on the receiving stream, with no copy on the host first (Tensor::to would
// copy it into the upload staging's own page-locked slot, to be free to return at once). The
// buffer then waits for an event behind that copy before it is handed out again.
//
// A message to be sent goes to its buffer the other way (download): a CUDA copy on a stream of
// the buffers' own, behind the work queued so far on the caller's stream, so that neither the
// caller's thread nor its stream waits for it; the event it returns says when the buffer holds the
// message (the host route's sender waits for it on its own thread: staged_send_queue.h).
//
// Invariants: a buffer handed out by acquire() is handed out again only after release(), or after
// upload_and_release() and the completion of its copy; the pool holds at most what was in flight
// at once (one step's sends, a stage's receives being copied). download() reads its source on
// the copy stream: the caller keeps the source alive and unwritten until the copy has completed.
// Thread-safe (the executor's compute and p2p threads send and receive at once).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace weft {

namespace cuda {
class Event;
class Stream;
}  // namespace cuda

class HostMessageBuffers {
 public:
  // `page_locked`: buffers from Tensor::empty_pinned (which needs a CUDA device), else pageable
  // (the tests of the pooling on machines without one).
  explicit HostMessageBuffers(bool page_locked = true) : page_locked_(page_locked) {}
  // A contiguous CPU tensor of `shape` and `dtype`, free for the caller until release().
  Tensor acquire(absl::Span<const int64_t> shape, DType dtype);
  // Gives `buffer` (from acquire) back for a later message.
  void release(const Tensor& buffer);
  // Copies `buffer` (from acquire) into `destination` (contiguous, of its shape and dtype) and gives
  // it back. Page-locked buffers into a CUDA tensor: on the calling thread's current stream of that
  // device, asynchronously, the buffer handed out again once the copy has completed. Otherwise
  // (pageable buffers, a CPU destination) the copy is done when this returns.
  void upload_and_release(const Tensor& buffer, const Tensor& destination);
  // Copies `source` (contiguous, of `buffer`'s shape and dtype) into `buffer` (from acquire). A CUDA
  // source into a page-locked buffer: on the copy stream of its device, after the work queued so
  // far on the calling thread's current stream of that device, without waiting for either; returns
  // the event that completes with the copy. Otherwise the copy is done when this returns (null).
  std::shared_ptr<cuda::Event> download(const Tensor& source, const Tensor& buffer);
  // Blocks until `copied` (from download of a tensor on `device`; null: at once) has completed,
  // rethrowing a CUDA failure. Makes `device` current on the calling thread first: a thread that
  // touches CUDA with no device current gets device 0's context, wherever its rank's GPU is.
  static void wait_until_copied(const std::shared_ptr<cuda::Event>& copied, Device device);
  // Buffers held, in use or free (for tests).
  int64_t buffers() const;

 private:
  struct Free {
    Tensor buffer;
    std::shared_ptr<cuda::Event> copied;  // null, or an upload from it that must complete first
  };
  static std::string key(absl::Span<const int64_t> shape, DType dtype);
  void give_back(const Tensor& buffer, std::shared_ptr<cuda::Event> copied);
  // True once nothing reads `free`'s buffer any more (its upload, if any, has completed).
  static bool copied_out(const Free& free);
  const bool page_locked_;
  mutable std::mutex mutex_;
  // download's copy streams, by device (shared_ptr: cuda::Stream is complete in CUDA builds only)
  std::map<int, std::shared_ptr<cuda::Stream>> copy_streams_;
  std::map<std::string, std::vector<Free>> free_;  // by dtype and shape
  int64_t buffers_ = 0;
};

}  // namespace weft
