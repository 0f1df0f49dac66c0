// The caching host allocator (see cpu_caching_allocator.h).
//
// Cached blocks sit in one recency list (oldest first) and, per rounded size, in a deque of
// iterators into it (oldest first too): a hit takes the newest of its size (back), an eviction the
// oldest of all (recency front, which is the front of its size's deque), both O(1).
#include "runtime/cpu_caching_allocator.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "runtime/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define WEFT_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef WEFT_ADDRESS_SANITIZER
#define WEFT_ADDRESS_SANITIZER 0
#endif

namespace weft {
namespace {

void* system_allocate(size_t alignment, size_t bytes) { return std::aligned_alloc(alignment, bytes); }
void system_release(void* pointer) { std::free(pointer); }

// WEFT_CPU_CACHE_MB when set (a whole number of MiB, 0 turns the cache off), else -1: follow the peak.
int64_t cache_cap_from_environment() {
#if WEFT_ADDRESS_SANITIZER
  return 0;  // ASan: a cached block handed out again would hide a use after free
#else
  const char* value = std::getenv("WEFT_CPU_CACHE_MB");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long long megabytes = std::strtoll(value, &end, 10);
  WEFT_CHECK(*end == '\0' && megabytes >= 0, "WEFT_CPU_CACHE_MB must be a whole number of MiB (0 turns the host ",
             "memory cache off), not '", value, "'");
  return static_cast<int64_t>(megabytes) << 20;
#endif
}

// WEFT_CPU_FILL_FRESH=1: every block handed out, fresh or reused, is filled with 0xFF bytes (a NaN
// in every float type), so a reader of memory that was never written shows in the results.
bool fill_fresh_from_environment() {
  const char* value = std::getenv("WEFT_CPU_FILL_FRESH");
  return value != nullptr && std::string(value) == "1";
}

CpuCachingAllocator& instance() {
  // Leaked on purpose: tensors held in static objects may be freed after static destructors ran.
  static CpuCachingAllocator* allocator =
      new CpuCachingAllocator(SystemMemory{system_allocate, system_release}, cache_cap_from_environment());
  return *allocator;
}

class FillingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Device device) override {
    void* pointer = instance().allocate(bytes, device);
    if (pointer != nullptr) std::memset(pointer, 0xFF, bytes);
    return pointer;
  }
  void deallocate(void* pointer, size_t bytes, Device device) override { instance().deallocate(pointer, bytes, device); }
};

Allocator& process_allocator() {
  static Allocator* allocator =
      fill_fresh_from_environment() ? static_cast<Allocator*>(new FillingAllocator) : &instance();
  return *allocator;
}

}  // namespace

CpuCachingAllocator::CpuCachingAllocator(SystemMemory system, int64_t cache_cap_bytes)
    : system_(system), cache_cap_bytes_(cache_cap_bytes) {}

CpuCachingAllocator::~CpuCachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_all();
}

size_t CpuCachingAllocator::round_size(size_t bytes) {
  const size_t granule = bytes < kCachedMinimum ? kAlignment : kPage;
  return (bytes + granule - 1) / granule * granule;
}

void* CpuCachingAllocator::allocate(size_t bytes, Device device) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  const bool cacheable = size >= kCachedMinimum;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes += static_cast<int64_t>(size);
    if (stats_.in_use_bytes > stats_.peak_in_use_bytes) stats_.peak_in_use_bytes = stats_.in_use_bytes;
    if (stats_.in_use_bytes > most_in_use_bytes_) most_in_use_bytes_ = stats_.in_use_bytes;
    if (cacheable) {
      auto found = by_size_.find(size);
      if (found != by_size_.end() && !found->second.empty()) {
        const Recency::iterator block = found->second.back();
        found->second.pop_back();
        void* pointer = block->pointer;
        recency_.erase(block);
        stats_.cached_bytes -= static_cast<int64_t>(size);
        --stats_.cached_blocks;
        ++stats_.cache_hits;
        return pointer;
      }
      ++stats_.system_allocations;
    }
  }
  void* pointer = system_.allocate(kAlignment, size);
  if (pointer == nullptr) {
    // Out of memory: give back what the cache holds (it may be exactly what is missing) and retry.
    int64_t cached = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cached = stats_.cached_bytes;
      release_all();
    }
    if (cached > 0) pointer = system_.allocate(kAlignment, size);
  }
  if (pointer == nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes -= static_cast<int64_t>(size);
    if (cacheable) --stats_.system_allocations;
    WEFT_FAIL("out of host memory: could not allocate ", bytes, " bytes (weft has ", stats_.in_use_bytes,
              " bytes of host memory in use; its cache of freed blocks was emptied and the allocation retried)");
  }
  return pointer;
}

void CpuCachingAllocator::deallocate(void* pointer, size_t bytes, Device device) {
  if (pointer == nullptr) return;
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.in_use_bytes -= static_cast<int64_t>(size);
  const int64_t limit = cap();
  if (size < kCachedMinimum || static_cast<int64_t>(size) > limit) {
    system_.release(pointer);
    return;
  }
  while (stats_.cached_bytes + static_cast<int64_t>(size) > limit) evict_oldest();
  recency_.push_back(CachedBlock{pointer, size});
  try {
    by_size_[size].push_back(std::prev(recency_.end()));
  } catch (...) {  // out of memory for the bookkeeping itself: do not cache
    recency_.pop_back();
    system_.release(pointer);
    return;
  }
  stats_.cached_bytes += static_cast<int64_t>(size);
  ++stats_.cached_blocks;
}

int64_t CpuCachingAllocator::cap() const {
  return cache_cap_bytes_ >= 0 ? cache_cap_bytes_ : most_in_use_bytes_;
}

void CpuCachingAllocator::evict_oldest() {
  const CachedBlock oldest = recency_.front();
  auto& same_size = by_size_[oldest.size];
  same_size.pop_front();  // the oldest block of all is the oldest of its size
  if (same_size.empty()) by_size_.erase(oldest.size);
  recency_.pop_front();
  system_.release(oldest.pointer);
  stats_.cached_bytes -= static_cast<int64_t>(oldest.size);
  --stats_.cached_blocks;
}

void CpuCachingAllocator::release_all() {
  for (const CachedBlock& block : recency_) system_.release(block.pointer);
  recency_.clear();
  by_size_.clear();
  stats_.cached_bytes = 0;
  stats_.cached_blocks = 0;
}

CpuMemoryStats CpuCachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuCachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

void CpuCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_all();
}

CpuMemoryStats cpu_memory_stats() { return instance().stats(); }
void reset_cpu_peak() { instance().reset_peak(); }
void empty_cpu_cache() { instance().empty_cache(); }

Allocator& cpu_allocator() { return process_allocator(); }

}  // namespace weft
