#include "runtime/allocator.h"

#include <cstdlib>
#include <new>

#include "runtime/error.h"

namespace weft {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Device device) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* pointer = std::aligned_alloc(64, rounded);
    WEFT_CHECK(pointer != nullptr, "out of host memory: could not allocate ", bytes, " bytes");
    return pointer;
  }
  void deallocate(void* pointer, size_t bytes, Device device) override { std::free(pointer); }
};

Allocator* registered_cuda_allocator = nullptr;

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

void register_cuda_allocator(Allocator* allocator) { registered_cuda_allocator = allocator; }

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  WEFT_CHECK(registered_cuda_allocator != nullptr, "device ", device.to_string(),
             " requested, but this build of weft has no CUDA backend (rebuild with -DWEFT_CUDA=ON)");
  return *registered_cuda_allocator;
}

}  // namespace weft
