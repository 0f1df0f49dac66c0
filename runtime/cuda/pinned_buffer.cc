// Pinned host memory (see pinned_buffer.h).
#include "runtime/cuda/pinned_buffer.h"

#include <cuda_runtime.h>

#include <utility>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"

namespace weft::cuda {
namespace {

void* allocate_page_locked(size_t bytes) {
  if (bytes == 0) return nullptr;
  check_device(0);  // pinned memory needs a CUDA context, hence a device
  void* data = nullptr;
  const cudaError_t status = cudaMallocHost(&data, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    WEFT_FAIL("could not allocate ", bytes, " bytes of pinned host memory (cudaMallocHost: ",
              cudaGetErrorString(status), ")");
  }
  return data;
}

class PageLockedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, Device device) override {
    WEFT_CHECK(device.is_cpu(), "pinned host memory is host memory, not ", device.to_string());
    return allocate_page_locked(bytes);
  }
  void deallocate(void* pointer, size_t /*bytes*/, Device /*device*/) override {
    if (pointer != nullptr) cudaFreeHost(pointer);
  }
};

}  // namespace

Allocator& page_locked_host_allocator() {
  static PageLockedHostAllocator* allocator = new PageLockedHostAllocator;  // leaked: outlives static tensors
  return *allocator;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : data_(allocate_page_locked(bytes)), size_(bytes) {}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace weft::cuda
