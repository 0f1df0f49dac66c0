// Pinned (page-locked) host memory for host <-> device transfers.
//
// A copy from pinned memory runs as a true asynchronous DMA on a stream, and a copy into it can be
// waited for with an event instead of a stream synchronization: this is how losses and timings come
// back to the host without stalling a step (see DESIGN.md, "no host synchronisation inside a step").
// PinnedBuffer owns one cudaMallocHost block; it is movable, not copyable.
// page_locked_host_allocator() hands out such blocks behind the Allocator interface, for CPU tensors
// that stage device transfers (Tensor::empty_pinned; the CUDA backend registers it at start-up).
#pragma once

#include <cstddef>

#include "runtime/allocator.h"

namespace weft::cuda {

// cudaMallocHost / cudaFreeHost for CPU storage; nothing is cached (see pinned_host_allocator()).
Allocator& page_locked_host_allocator();

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // Allocates `bytes` of pinned host memory; weft::Error when there is no CUDA device or no memory.
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace weft::cuda
