// The caching host allocator (runtime/cpu_caching_allocator.h) over a counting system allocator
// that fails on demand: a freed large block comes back for a request of the same rounded size and
// only that size; small requests are never cached; cached bytes stay under the cap, the oldest
// evicted first; a failed system allocation empties the cache and retries once, then names the
// request; several threads allocating and freeing at once leave the counts balanced.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/cpu_caching_allocator.h"
#include "runtime/error.h"

namespace weft {
namespace {

std::atomic<int> system_allocations{0};
std::atomic<int> system_releases{0};
std::atomic<int> failures_to_inject{0};  // the next this many system allocations fail
std::atomic<bool> fail_always{false};

void* counting_allocate(size_t alignment, size_t bytes) {
  if (fail_always.load()) return nullptr;
  if (failures_to_inject.load() > 0) {
    --failures_to_inject;
    return nullptr;
  }
  ++system_allocations;
  return std::aligned_alloc(alignment, bytes);
}

void counting_release(void* pointer) {
  ++system_releases;
  std::free(pointer);
}

class CpuCachingAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    system_allocations = 0;
    system_releases = 0;
    failures_to_inject = 0;
    fail_always = false;
  }
  static SystemMemory counting() { return SystemMemory{counting_allocate, counting_release}; }
  static constexpr size_t kLarge = size_t{1} << 20;
  const Device cpu = Device::cpu();
};

TEST_F(CpuCachingAllocatorTest, RoundsSmallTo64BytesAndLargeToPages) {
  EXPECT_EQ(CpuCachingAllocator::round_size(1), 64u);
  EXPECT_EQ(CpuCachingAllocator::round_size(65), 128u);
  EXPECT_EQ(CpuCachingAllocator::round_size(65535), 65536u);
  EXPECT_EQ(CpuCachingAllocator::round_size(65537), 65536u + 4096u);
  EXPECT_EQ(CpuCachingAllocator::round_size(103'000'001), 103'002'112u);
}

TEST_F(CpuCachingAllocatorTest, FreedLargeBlockIsHandedOutAgainForTheSameRoundedSize) {
  CpuCachingAllocator allocator(counting(), /*cache_cap_bytes=*/-1);
  void* first = allocator.allocate(kLarge + 1, cpu);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  std::memset(first, 7, kLarge + 1);
  allocator.deallocate(first, kLarge + 1, cpu);
  EXPECT_EQ(allocator.stats().cached_blocks, 1);
  void* again = allocator.allocate(kLarge + 100, cpu);  // same page-rounded size
  EXPECT_EQ(again, first);
  EXPECT_EQ(system_allocations.load(), 1);
  const CpuMemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.system_allocations, 1);
  EXPECT_EQ(stats.cached_bytes, 0);
  EXPECT_EQ(stats.in_use_bytes, static_cast<int64_t>(kLarge + 4096));
  allocator.deallocate(again, kLarge + 100, cpu);
}

TEST_F(CpuCachingAllocatorTest, SizesAreKeptApartAndSmallBlocksAreNotCached) {
  CpuCachingAllocator allocator(counting(), -1);
  void* large = allocator.allocate(kLarge, cpu);
  void* larger = allocator.allocate(2 * kLarge, cpu);
  void* small = allocator.allocate(1000, cpu);
  allocator.deallocate(large, kLarge, cpu);
  allocator.deallocate(larger, 2 * kLarge, cpu);
  allocator.deallocate(small, 1000, cpu);
  EXPECT_EQ(system_releases.load(), 1);  // the small block went straight back
  EXPECT_EQ(allocator.stats().cached_bytes, static_cast<int64_t>(3 * kLarge));
  void* other = allocator.allocate(kLarge + 4096, cpu);  // a size nothing cached has
  EXPECT_NE(other, large);
  EXPECT_NE(other, larger);
  EXPECT_EQ(allocator.allocate(2 * kLarge, cpu), larger);
  EXPECT_EQ(allocator.allocate(kLarge, cpu), large);
  EXPECT_EQ(allocator.stats().cached_blocks, 0);
  allocator.deallocate(other, kLarge + 4096, cpu);
  allocator.deallocate(larger, 2 * kLarge, cpu);
  allocator.deallocate(large, kLarge, cpu);
}

TEST_F(CpuCachingAllocatorTest, CachedBytesStayUnderTheCapEvictingTheOldestFirst) {
  CpuCachingAllocator allocator(counting(), /*cache_cap_bytes=*/2 * kLarge);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(allocator.allocate(kLarge, cpu));
  for (void* block : blocks) allocator.deallocate(block, kLarge, cpu);
  CpuMemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.cached_bytes, static_cast<int64_t>(2 * kLarge));
  EXPECT_EQ(system_releases.load(), 1);
  // The oldest (blocks[0]) went; the newest comes back first.
  EXPECT_EQ(allocator.allocate(kLarge, cpu), blocks[2]);
  EXPECT_EQ(allocator.allocate(kLarge, cpu), blocks[1]);
  allocator.deallocate(blocks[2], kLarge, cpu);
  allocator.deallocate(blocks[1], kLarge, cpu);

  // A block larger than the cap is never cached; the cap 0 turns caching off.
  void* huge = allocator.allocate(3 * kLarge, cpu);
  allocator.deallocate(huge, 3 * kLarge, cpu);
  EXPECT_EQ(allocator.stats().cached_bytes, static_cast<int64_t>(2 * kLarge));
  CpuCachingAllocator off(counting(), 0);
  off.deallocate(off.allocate(kLarge, cpu), kLarge, cpu);
  EXPECT_EQ(off.stats().cached_blocks, 0);
}

TEST_F(CpuCachingAllocatorTest, DefaultCapIsThePeakInUse) {
  CpuCachingAllocator allocator(counting(), -1);
  void* a = allocator.allocate(kLarge, cpu);
  void* b = allocator.allocate(kLarge, cpu);
  allocator.deallocate(a, kLarge, cpu);
  allocator.deallocate(b, kLarge, cpu);
  // Shapes change: new sizes displace the old ones and the cache never exceeds the peak (2 MiB).
  for (size_t size = 2 * kLarge; size < 6 * kLarge; size += kLarge / 2) {
    allocator.deallocate(allocator.allocate(size, cpu), size, cpu);
    const CpuMemoryStats stats = allocator.stats();
    EXPECT_LE(stats.cached_bytes, stats.peak_in_use_bytes);
    EXPECT_EQ(stats.in_use_bytes, 0);
  }
  allocator.reset_peak();
  EXPECT_EQ(allocator.stats().peak_in_use_bytes, 0);
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().cached_bytes, 0);
  EXPECT_EQ(system_releases.load(), system_allocations.load());
}

TEST_F(CpuCachingAllocatorTest, FailedAllocationReleasesTheCacheAndRetriesOnce) {
  CpuCachingAllocator allocator(counting(), -1);
  void* block = allocator.allocate(kLarge, cpu);
  allocator.deallocate(block, kLarge, cpu);
  ASSERT_EQ(allocator.stats().cached_blocks, 1);
  failures_to_inject = 1;
  void* other = allocator.allocate(2 * kLarge, cpu);  // a miss: fails, cache released, retried
  EXPECT_NE(other, nullptr);
  EXPECT_EQ(failures_to_inject.load(), 0);
  EXPECT_EQ(allocator.stats().cached_blocks, 0);
  EXPECT_EQ(system_releases.load(), 1);
  allocator.deallocate(other, 2 * kLarge, cpu);

  fail_always = true;
  try {
    allocator.allocate(123'456'789, cpu);
    FAIL() << "expected weft::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("could not allocate 123456789 bytes"), std::string::npos)
        << error.what();
  }
  const CpuMemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.cached_blocks, 0);  // released before the retry
  EXPECT_EQ(stats.in_use_bytes, 0);   // the failed request is not counted
  // Small requests take the same path.
  EXPECT_THROW(allocator.allocate(100, cpu), Error);
}

TEST_F(CpuCachingAllocatorTest, ThreadsAllocateAndFreeConcurrently) {
  CpuCachingAllocator allocator(counting(), -1);
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> corrupted{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const size_t bytes = (round % 3 == 0) ? 512 : kLarge / 4 * static_cast<size_t>(1 + round % 4);
        auto* block = static_cast<unsigned char*>(allocator.allocate(bytes, cpu));
        std::memset(block, t + 1, bytes);  // a block shared by two threads would show here
        for (size_t i = 0; i < bytes; i += 4096) corrupted += block[i] != t + 1;
        allocator.deallocate(block, bytes, cpu);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(corrupted.load(), 0);
  const CpuMemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_GT(stats.cache_hits, 0);
  EXPECT_LE(stats.cached_bytes, stats.peak_in_use_bytes);
  allocator.empty_cache();
  EXPECT_EQ(system_releases.load(), system_allocations.load());
}

TEST(CpuAllocator, IsTheCachingAllocatorWithStatistics) {
  const CpuMemoryStats before = cpu_memory_stats();
  void* block = cpu_allocator().allocate(size_t{1} << 20, Device::cpu());
  EXPECT_EQ(cpu_memory_stats().in_use_bytes, before.in_use_bytes + (int64_t{1} << 20));
  cpu_allocator().deallocate(block, size_t{1} << 20, Device::cpu());
  EXPECT_EQ(cpu_memory_stats().in_use_bytes, before.in_use_bytes);
}

}  // namespace
}  // namespace weft
