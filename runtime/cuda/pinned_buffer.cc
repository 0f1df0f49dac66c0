// Pinned host memory (see pinned_buffer.h).
#include "runtime/cuda/pinned_buffer.h"

#include <cuda_runtime.h>

#include <utility>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"

namespace weft::cuda {

PinnedBuffer::PinnedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  check_device(0);  // pinned memory needs a CUDA context, hence a device
  const cudaError_t status = cudaMallocHost(&data_, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    data_ = nullptr;
    WEFT_FAIL("could not allocate ", bytes, " bytes of pinned host memory (cudaMallocHost: ",
              cudaGetErrorString(status), ")");
  }
}

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
