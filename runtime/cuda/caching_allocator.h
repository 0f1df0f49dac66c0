// The caching device allocator: every CUDA tensor's memory, without a cudaMalloc per tensor.
//
// Requests are rounded to size classes (a multiple of 512 B below 1 MiB, of 2 MiB above) and served
// from blocks cached per (device, stream): a freed block goes back to the cache of the stream that
// is current on the freeing thread, and only a request on that same stream can reuse it, so stream
// order alone makes the reuse safe. (When the freeing stream is not the one the block was allocated
// on, the freeing stream is first made to wait for the allocating stream's work so far.) After the
// first training step every request is a cache hit, which is what lets a whole step be captured
// into one CUDA graph.
//
// Pools are keyed by the stream's process-unique id (runtime/stream_retirement.h), not by its
// handle, which CUDA reuses after a stream is destroyed: a new stream never receives a block that
// a destroyed stream's queued work may still touch. When weft destroys a stream (cuda::Stream), its
// work is finished, so its cached blocks go back to CUDA and a block of it still in use returns,
// when freed, to the pool of the freeing stream without an event on the dead stream.
//
// Out of memory: when cudaMalloc fails, every cached block of the device is freed and the request
// retried once; then weft::Error names the request, what is allocated and what is reserved.
//
// It is registered as the CUDA allocator of runtime/allocator.h when libweft loads
// (cuda_backend.cc); it touches no GPU until the first request.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/allocator.h"

namespace weft::cuda {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // in blocks handed out now (size-class rounded)
  int64_t peak_allocated_bytes = 0;  // the most allocated_bytes since start or reset_peak
  int64_t reserved_bytes = 0;        // obtained from cudaMalloc: allocated plus cached
  int64_t active_blocks = 0;         // blocks handed out now
  int64_t cached_blocks = 0;         // blocks free in the cache
  int64_t cuda_malloc_count = 0;     // cudaMalloc calls so far (a steady-state step adds none)
  int64_t cache_hit_count = 0;       // requests served from the cache
};

// The statistics of one device (all zero for a device never used).
MemoryStats memory_stats(int device);
// Sets the peak of `device` to what is allocated now.
void reset_peak(int device);
// Returns every cached (free) block of every device to CUDA, waiting for the devices first.
void empty_cache();

// Size-class rounding, exposed for tests: 512 B granules below 1 MiB, 2 MiB granules above.
size_t round_allocation_size(size_t bytes);

// The process-wide caching allocator (what allocator_for(cuda:N) returns).
Allocator& caching_allocator();

}  // namespace weft::cuda
