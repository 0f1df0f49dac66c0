// Memory allocators behind tensor storage.
//
// An Allocator hands out raw blocks for one device type. The CPU allocator returns 64-byte aligned
// host memory (so vector loads never straddle a cache line) and keeps freed large blocks for reuse
// (runtime/cpu_caching_allocator.h); the CUDA backend's caching device allocator
// (runtime/cuda/caching_allocator.h) sits behind the same interface. Neither zeroes memory. Blocks are returned to the allocator that
// made them; Storage guarantees this.
#pragma once

#include <cstddef>

#include "runtime/device.h"

namespace weft {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns a block of at least `bytes` bytes on `device` (nullptr for 0 bytes); throws weft::Error
  // when memory is exhausted, naming the request.
  virtual void* allocate(size_t bytes, Device device) = 0;
  virtual void deallocate(void* pointer, size_t bytes, Device device) = 0;
};

// The process-wide allocator for host memory (the caching one of runtime/cpu_caching_allocator.h).
Allocator& cpu_allocator();

// The allocator for a device: the CPU allocator, or the registered CUDA allocator (weft::Error when
// the build has no CUDA backend).
Allocator& allocator_for(Device device);
// Installs the allocator used for CUDA devices (called by the CUDA backend at start-up).
void register_cuda_allocator(Allocator* allocator);

// Host memory that device transfers read and write directly: page-locked (pinned) memory when the
// CUDA backend has registered its allocator for it, the CPU allocator otherwise (a build without
// CUDA has nothing to pin for). Blocks are for long-lived staging buffers (checkpoint copies):
// pinning is slow to set up and takes memory from the host's pageable pool, so nothing caches them.
Allocator& pinned_host_allocator();
void register_pinned_host_allocator(Allocator* allocator);

}  // namespace weft
