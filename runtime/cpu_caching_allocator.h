// The caching host allocator: every CPU tensor's memory, without a page fault per step.
//
// glibc serves a request above its mmap threshold (128 KiB at first, raised up to 32 MiB as blocks
// are freed) with a fresh mmap and unmaps it on free, so a training step that allocates the same
// large activations every step faults all their pages in again each time (the kernel's page
// zeroing was 40% of a GPT-2-vocabulary CPU run). This allocator keeps freed blocks instead.
//
// Size classes. A request below kCachedMinimum (64 KiB) goes straight to aligned_alloc: glibc's own
// bins already reuse small chunks without a system call, and caching them here would only add a
// lock. A larger request is rounded up to whole 4 KiB pages (at most one page, under 6.25%, wasted)
// and served from the freed blocks of exactly that rounded size, the most recently freed first (its
// pages are the likeliest still in cache). Training repeats the same shapes every step, so after the
// first step every large request is a hit.
//
// Bounds. Cached bytes never exceed a cap: WEFT_CPU_CACHE_MB when set (0 turns the cache off),
// otherwise the peak of bytes in use so far, so the process holds at most about twice its peak. A
// block freed over the cap evicts the oldest cached blocks first, so a run whose shapes change keeps
// the new shapes and lets the old go. When the system allocation fails, every cached block is
// released and the request retried once; then weft::Error names the request, the bytes in use and
// the bytes cached.
//
// Reused memory is not zeroed (as with malloc): a reader of memory that was never written is a bug
// that fresh, zeroed mmap pages would have hidden. WEFT_CPU_FILL_FRESH=1 fills every block handed
// out with 0xFF bytes (NaN as a float), which makes such a reader show.
//
// AddressSanitizer: under ASan (tools/sanitize) the process-wide allocator does not cache, so a use
// of a freed tensor is still reported, not hidden by the block being handed out again. The class
// itself (and its unit test) works the same under ASan.
//
// Thread-safe: one mutex, held for a few container operations. New system allocations run outside
// it; the frees of evicted or uncached blocks run under it (a free of a block above glibc's mmap
// threshold is one munmap, and a steady step frees none).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_map>

#include "runtime/allocator.h"

namespace weft {

struct CpuMemoryStats {
  int64_t in_use_bytes = 0;       // in blocks handed out now (rounded as the allocator rounds)
  int64_t peak_in_use_bytes = 0;  // the most in_use_bytes since start or reset_peak
  int64_t cached_bytes = 0;       // freed large blocks kept for reuse
  int64_t cached_blocks = 0;      // how many
  int64_t system_allocations = 0;  // large requests that went to the system (a steady step adds none)
  int64_t cache_hits = 0;          // large requests served from the cache
};

// Where the caching allocator gets and returns memory: aligned_alloc and free for the process; a
// test substitutes functions that fail on demand.
struct SystemMemory {
  void* (*allocate)(size_t alignment, size_t bytes) = nullptr;  // nullptr on failure
  void (*release)(void* pointer) = nullptr;
};

class CpuCachingAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;               // a cache line: vector loads never straddle one
  static constexpr size_t kCachedMinimum = size_t{64} << 10;  // 64 KiB: below it, malloc's bins
  static constexpr size_t kPage = 4096;

  // cache_cap_bytes < 0: the cap follows the peak in use; 0: nothing is cached.
  CpuCachingAllocator(SystemMemory system, int64_t cache_cap_bytes);
  ~CpuCachingAllocator() override;  // returns the cached blocks (blocks in use are the caller's)

  void* allocate(size_t bytes, Device device) override;
  // `bytes` must be what allocate was asked for (Storage guarantees it); never throws.
  void deallocate(void* pointer, size_t bytes, Device device) override;

  CpuMemoryStats stats();
  void reset_peak();
  // Returns every cached block to the system.
  void empty_cache();

  // The size a request is rounded to: 64 B granules below kCachedMinimum, whole pages above.
  static size_t round_size(size_t bytes);

 private:
  struct CachedBlock {
    void* pointer;
    size_t size;
  };
  using Recency = std::list<CachedBlock>;  // oldest first

  int64_t cap() const;  // mutex held
  void evict_oldest();  // mutex held
  void release_all();   // mutex held

  SystemMemory system_;
  int64_t cache_cap_bytes_;
  int64_t most_in_use_bytes_ = 0;  // the peak since start, which reset_peak leaves alone: the cap
  std::mutex mutex_;
  CpuMemoryStats stats_;
  Recency recency_;
  std::unordered_map<size_t, std::deque<Recency::iterator>> by_size_;  // rounded size -> oldest first
};

// The process-wide host allocator's statistics (what cpu_allocator() has handed out and cached).
CpuMemoryStats cpu_memory_stats();
void reset_cpu_peak();
void empty_cpu_cache();

}  // namespace weft
