// HostMessageBuffers (host_message_buffers.h).
#include "parallel/pipeline/host_message_buffers.h"

#include "absl/strings/str_join.h"
#include "runtime/error.h"

#if WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {

std::string HostMessageBuffers::key(absl::Span<const int64_t> shape, DType dtype) {
  return std::string(dtype_name(dtype)) + "[" + absl::StrJoin(shape, ",") + "]";
}

Tensor HostMessageBuffers::acquire(absl::Span<const int64_t> shape, DType dtype) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_.find(key(shape, dtype));
    if (found != free_.end()) {
      std::vector<Free>& free = found->second;
      for (size_t i = free.size(); i-- > 0;) {
        if (!copied_out(free[i])) continue;  // its upload is still reading it: leave it be
        Tensor buffer = std::move(free[i].buffer);
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
        return buffer;
      }
    }
    ++buffers_;
  }
  return page_locked_ ? Tensor::empty_pinned(shape, dtype) : Tensor::empty(shape, dtype, Device::cpu());
}

void HostMessageBuffers::release(const Tensor& buffer) { give_back(buffer, nullptr); }

void HostMessageBuffers::upload_and_release(const Tensor& buffer, const Tensor& destination) {
  WEFT_CHECK(destination.defined() && destination.is_contiguous() && destination.shape() == buffer.shape() &&
                 destination.dtype() == buffer.dtype(),
             "HostMessageBuffers::upload_and_release: ", destination.describe(), " is not a contiguous tensor of ",
             buffer.describe(), "'s shape and dtype");
#if WEFT_HAVE_CUDA
  if (page_locked_ && destination.device().is_cuda()) {
    const int device = destination.device().index;
    cuda::set_device(device);
    const cudaStream_t stream = cuda::current_stream(device);
    WEFT_CUDA_CHECK(cudaMemcpyAsync(destination.raw_data(), buffer.raw_data(),
                                    static_cast<size_t>(buffer.numel() * buffer.element_size()),
                                    cudaMemcpyHostToDevice, stream));
    auto copied = std::make_shared<cuda::Event>();
    copied->record(stream);
    give_back(buffer, std::move(copied));
    return;
  }
#endif
  Tensor(destination).copy_(buffer);
  give_back(buffer, nullptr);
}

std::shared_ptr<cuda::Event> HostMessageBuffers::download(const Tensor& source, const Tensor& buffer) {
  WEFT_CHECK(source.defined() && source.is_contiguous() && source.shape() == buffer.shape() &&
                 source.dtype() == buffer.dtype(),
             "HostMessageBuffers::download: ", source.describe(), " is not a contiguous tensor of ", buffer.describe(),
             "'s shape and dtype");
#if WEFT_HAVE_CUDA
  if (page_locked_ && source.device().is_cuda()) {
    const int device = source.device().index;
    cuda::set_device(device);
    std::shared_ptr<cuda::Stream> copy_stream;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::shared_ptr<cuda::Stream>& stream = copy_streams_[device];
      if (stream == nullptr) stream = std::make_shared<cuda::Stream>(device);
      copy_stream = stream;
    }
    // The copy starts once the tensor is written: after the work queued so far where it was made.
    cuda::Event written;
    written.record(cuda::current_stream(device));
    written.wait(copy_stream->get());
    WEFT_CUDA_CHECK(cudaMemcpyAsync(buffer.raw_data(), source.raw_data(),
                                    static_cast<size_t>(source.numel() * source.element_size()),
                                    cudaMemcpyDeviceToHost, copy_stream->get()));
    auto copied = std::make_shared<cuda::Event>();
    copied->record(copy_stream->get());
    return copied;
  }
#endif
  Tensor(buffer).copy_(source);
  return nullptr;
}

void HostMessageBuffers::wait_until_copied(const std::shared_ptr<cuda::Event>& copied, Device device) {
#if WEFT_HAVE_CUDA
  if (copied == nullptr) return;
  cuda::set_device(device.index);
  copied->synchronize();
#else
  (void)device;
  WEFT_CHECK(copied == nullptr, "HostMessageBuffers::wait_until_copied: a CUDA event in a build without CUDA");
#endif
}

void HostMessageBuffers::give_back(const Tensor& buffer, std::shared_ptr<cuda::Event> copied) {
  WEFT_CHECK(buffer.defined() && buffer.device().is_cpu() && buffer.is_contiguous(),
             "HostMessageBuffers::release: ", buffer.describe(), " is not a buffer it handed out");
  std::lock_guard<std::mutex> lock(mutex_);
  free_[key(buffer.shape(), buffer.dtype())].push_back({buffer, std::move(copied)});
}

bool HostMessageBuffers::copied_out(const Free& free) {
  if (free.copied == nullptr) return true;
#if WEFT_HAVE_CUDA
  const cudaError_t status = cudaEventQuery(free.copied->get());
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: the copy is still running
    return false;
  }
  WEFT_CUDA_CHECK(status);
#endif
  return true;
}

int64_t HostMessageBuffers::buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffers_;
}

}  // namespace weft
