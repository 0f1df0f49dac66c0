#include "runtime/allocator.h"

#include "runtime/error.h"

namespace weft {
namespace {

Allocator* registered_cuda_allocator = nullptr;
Allocator* registered_pinned_host_allocator = nullptr;

}  // namespace

// cpu_allocator() is the caching host allocator, in runtime/cpu_caching_allocator.cc.

void register_cuda_allocator(Allocator* allocator) { registered_cuda_allocator = allocator; }

void register_pinned_host_allocator(Allocator* allocator) { registered_pinned_host_allocator = allocator; }

Allocator& pinned_host_allocator() {
  return registered_pinned_host_allocator != nullptr ? *registered_pinned_host_allocator : cpu_allocator();
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  WEFT_CHECK(registered_cuda_allocator != nullptr, "device ", device.to_string(),
             " requested, but this build of weft has no CUDA backend (rebuild with -DWEFT_CUDA=ON)");
  return *registered_cuda_allocator;
}

}  // namespace weft
