// HostMessageBuffers (host_message_buffers.h).
#include "parallel/pipeline/host_message_buffers.h"

#include "absl/strings/str_join.h"
#include "runtime/error.h"

namespace weft {

std::string HostMessageBuffers::key(absl::Span<const int64_t> shape, DType dtype) {
  return std::string(dtype_name(dtype)) + "[" + absl::StrJoin(shape, ",") + "]";
}

Tensor HostMessageBuffers::acquire(absl::Span<const int64_t> shape, DType dtype) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_.find(key(shape, dtype));
    if (found != free_.end() && !found->second.empty()) {
      Tensor buffer = std::move(found->second.back());
      found->second.pop_back();
      return buffer;
    }
    ++buffers_;
  }
  return page_locked_ ? Tensor::empty_pinned(shape, dtype) : Tensor::empty(shape, dtype, Device::cpu());
}

void HostMessageBuffers::release(const Tensor& buffer) {
  WEFT_CHECK(buffer.defined() && buffer.device().is_cpu() && buffer.is_contiguous(),
             "HostMessageBuffers::release: ", buffer.describe(), " is not a buffer it handed out");
  std::lock_guard<std::mutex> lock(mutex_);
  free_[key(buffer.shape(), buffer.dtype())].push_back(buffer);
}

int64_t HostMessageBuffers::buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffers_;
}

}  // namespace weft
