// The caching device allocator (see caching_allocator.h).
//
// Blocks are whole cudaMalloc allocations (no splitting): a request takes the smallest cached block
// of its (device, stream) pool that is at least its size class and at most a quarter larger, so a
// large block is never pinned down by a small tensor. One mutex guards everything; the work under
// it is a few map operations except on a cache miss.
#include "runtime/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"

namespace weft::cuda {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;     // 1 MiB
constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeGranule = size_t{2} << 20;   // 2 MiB

std::string format_bytes(int64_t bytes) {
  std::ostringstream out;
  out << bytes << " bytes (" << std::fixed << std::setprecision(2)
      << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB)";
  return out.str();
}

struct Block {
  size_t size = 0;  // size-class rounded: what cudaMalloc was asked for
  int device = 0;
  cudaStream_t stream = nullptr;  // the stream whose pool it returns to (for events on it)
  uint64_t stream_id = 0;         // that stream's id: the pool's key
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator() {
    // Never removed: the allocator is never destroyed (see instance()).
    add_stream_retired_listener([this](const StreamKey& stream) { retire(stream); });
  }

  void* allocate(size_t bytes, Device device) override {
    const int index = device.index;
    check_device(index);  // "no CUDA device is available (...)" on a machine without one
    if (bytes == 0) return nullptr;
    const size_t size = round_allocation_size(bytes);
    const cudaStream_t stream = current_stream(index);
    const uint64_t stream_id = current_stream_id(index);

    std::lock_guard<std::mutex> lock(mutex_);
    MemoryStats& stats = stats_for(index);
    auto& pool = pools_[{index, stream_id}];
    auto found = pool.lower_bound(size);
    if (found != pool.end() && found->first <= size + size / 4) {
      void* pointer = found->second;
      const size_t block_size = found->first;
      pool.erase(found);
      --stats.cached_blocks;
      ++stats.cache_hit_count;
      hand_out(pointer, Block{block_size, index, stream, stream_id}, stats);
      return pointer;
    }

    set_device(index);
    void* pointer = nullptr;
    cudaError_t status = cudaMalloc(&pointer, size);
    if (status != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it before retrying
      release_cached(index);
      status = cudaMalloc(&pointer, size);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
      cudaGetLastError();
      WEFT_FAIL("CUDA out of memory on ", device.to_string(), ": could not allocate ",
                format_bytes(static_cast<int64_t>(bytes)), " (cudaMalloc: ", cudaGetErrorString(status),
                "); weft has ", format_bytes(stats.allocated_bytes), " allocated and ",
                format_bytes(stats.reserved_bytes), " reserved on this device",
                have_info ? str("; the device has ", format_bytes(static_cast<int64_t>(free_bytes)), " free of ",
                                format_bytes(static_cast<int64_t>(total_bytes)))
                          : std::string(),
                ". Lower the activations in flight: train.recompute: selective or full (activations rebuilt in "
                "backward), more train.micro_batches (a smaller micro-batch), a shorter model.seq_len, or "
                "train.dtype: bf16; or free tensors that are still referenced.");
    }
    ++stats.cuda_malloc_count;
    stats.reserved_bytes += static_cast<int64_t>(size);
    hand_out(pointer, Block{size, index, stream, stream_id}, stats);
    return pointer;
  }

  // Never throws: it runs from Storage's destructor, possibly during process exit.
  void deallocate(void* pointer, size_t bytes, Device device) override {
    if (pointer == nullptr) return;
    cudaStream_t free_stream = nullptr;
    uint64_t free_stream_id = 0;
    try {
      free_stream = current_stream(device.index);
      free_stream_id = current_stream_id(device.index);
    } catch (const Error&) {
      free_stream = nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto live = live_.find(pointer);
    if (live == live_.end()) return;  // not ours: nothing sensible to do in a destructor
    Block block = live->second;
    live_.erase(live);
    MemoryStats& stats = stats_for(block.device);
    stats.allocated_bytes -= static_cast<int64_t>(block.size);
    --stats.active_blocks;
    if (free_stream != nullptr && free_stream_id != block.stream_id) {
      if (retired_.contains({block.device, block.stream_id})) {
        // Its stream's work has finished (retire), and the stream is gone: no event to record.
        block.stream = free_stream;
        block.stream_id = free_stream_id;
      } else {
        // The block will be reused on free_stream: order that after the allocating stream's work so
        // far. The event must be created with the block's device current; the caller's is restored.
        int previous_device = -1;
        cudaGetDevice(&previous_device);
        cudaSetDevice(block.device);
        cudaEvent_t event = nullptr;
        if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess) {
          if (cudaEventRecord(event, block.stream) == cudaSuccess &&
              cudaStreamWaitEvent(free_stream, event, 0) == cudaSuccess) {
            block.stream = free_stream;
            block.stream_id = free_stream_id;
          }
          cudaEventDestroy(event);  // released once the recorded work completes
        }
        if (previous_device >= 0) cudaSetDevice(previous_device);
        cudaGetLastError();
      }
    }
    if (retired_.contains({block.device, block.stream_id})) {
      // No later request can come from a retired stream: caching the block there would strand it.
      int previous_device = -1;
      cudaGetDevice(&previous_device);
      cudaSetDevice(block.device);
      cudaFree(pointer);
      if (previous_device >= 0) cudaSetDevice(previous_device);
      cudaGetLastError();
      stats.reserved_bytes -= static_cast<int64_t>(block.size);
      return;
    }
    pools_[{block.device, block.stream_id}].emplace(block.size, pointer);
    ++stats.cached_blocks;
  }

  // A stream weft destroyed, after its work finished (runtime/stream_retirement.h): its cached
  // blocks go back to CUDA, and blocks of it still in use are freed to the stream that frees them.
  void retire(const StreamKey& stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    retired_.insert({stream.device, stream.id});
    auto pool = pools_.find({stream.device, stream.id});
    if (pool == pools_.end()) return;
    MemoryStats& stats = stats_for(stream.device);
    int previous_device = -1;
    cudaGetDevice(&previous_device);
    cudaSetDevice(stream.device);
    for (const auto& [size, pointer] : pool->second) {
      cudaFree(pointer);
      stats.reserved_bytes -= static_cast<int64_t>(size);
      --stats.cached_blocks;
    }
    if (previous_device >= 0) cudaSetDevice(previous_device);
    cudaGetLastError();
    pools_.erase(pool);
  }

  MemoryStats stats(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_for(device);
  }

  void reset_peak(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    MemoryStats& stats = stats_for(device);
    stats.peak_allocated_bytes = stats.allocated_bytes;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t device = 0; device < stats_.size(); ++device) {
      if (stats_[device].cached_blocks > 0) release_cached(static_cast<int>(device));
    }
  }

 private:
  using PoolKey = std::pair<int, uint64_t>;  // (device, stream id)

  MemoryStats& stats_for(int device) {
    if (device >= static_cast<int>(stats_.size())) stats_.resize(static_cast<size_t>(device) + 1);
    return stats_[static_cast<size_t>(device)];
  }

  void hand_out(void* pointer, const Block& block, MemoryStats& stats) {
    live_[pointer] = block;
    stats.allocated_bytes += static_cast<int64_t>(block.size);
    ++stats.active_blocks;
    if (stats.allocated_bytes > stats.peak_allocated_bytes) stats.peak_allocated_bytes = stats.allocated_bytes;
  }

  // Frees every cached block of `device` (mutex held). Cached blocks may still be read by queued
  // work of their stream, so the device is synchronized first.
  void release_cached(int device) {
    set_device(device);
    cudaDeviceSynchronize();
    cudaGetLastError();
    MemoryStats& stats = stats_for(device);
    for (auto& [key, pool] : pools_) {
      if (key.first != device) continue;
      for (const auto& [size, pointer] : pool) {
        cudaFree(pointer);
        stats.reserved_bytes -= static_cast<int64_t>(size);
        --stats.cached_blocks;
      }
      pool.clear();
    }
    cudaGetLastError();
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<PoolKey, std::multimap<size_t, void*>> pools_;  // (device, stream id) -> size -> block
  std::set<PoolKey> retired_;                              // streams weft destroyed (a few per run)
  std::vector<MemoryStats> stats_;                         // by device index
};

CachingAllocator& instance() {
  // Leaked on purpose: tensors held in static objects may be freed after static destructors ran.
  static CachingAllocator* allocator = new CachingAllocator;
  return *allocator;
}

}  // namespace

size_t round_allocation_size(size_t bytes) {
  if (bytes == 0) return 0;
  const size_t granule = bytes < kSmallLimit ? kSmallGranule : kLargeGranule;
  return (bytes + granule - 1) / granule * granule;
}

MemoryStats memory_stats(int device) { return instance().stats(device); }

void reset_peak(int device) { instance().reset_peak(device); }

void empty_cache() { instance().empty_cache(); }

Allocator& caching_allocator() { return instance(); }

}  // namespace weft::cuda
