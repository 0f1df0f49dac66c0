// Host buffers for asynchronous checkpoint saves (see checkpoint_staging.h).
#include "launcher/checkpoint_staging.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"

namespace weft {

std::map<std::string, Tensor> CheckpointStaging::copies(const std::map<std::string, Tensor>& tensors) {
  autograd::NoGradGuard no_grad;
  std::map<std::string, Tensor> result;
  for (const auto& [name, tensor] : tensors) {
    Buffer& buffer = buffers_[name];
    if (!buffer.host.defined() || buffer.host.shape() != tensor.shape() || buffer.host.dtype() != tensor.dtype()) {
      buffer = Buffer{};
      if (tensor.device().is_cuda()) {
        try {
          buffer.host = Tensor::empty_pinned(tensor.shape(), tensor.dtype());
          buffer.pinned = true;
        } catch (const Error&) {
          // The host may refuse to lock this much memory; pageable memory gives the same bytes.
          buffer.host = Tensor::empty(tensor.shape(), tensor.dtype(), Device::cpu());
        }
      } else {
        buffer.host = Tensor::empty(tensor.shape(), tensor.dtype(), Device::cpu());
      }
    }
    buffer.host.copy_(tensor);
    result.emplace(name, buffer.host);
  }
  // Names no longer saved (a changed model state) give their memory back.
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    it = tensors.contains(it->first) ? std::next(it) : buffers_.erase(it);
  }
  return result;
}

int64_t CheckpointStaging::bytes() const {
  int64_t total = 0;
  for (const auto& [name, buffer] : buffers_) total += buffer.host.numel() * dtype_size(buffer.host.dtype());
  return total;
}

int64_t CheckpointStaging::pinned_bytes() const {
  int64_t total = 0;
  for (const auto& [name, buffer] : buffers_) {
    if (buffer.pinned) total += buffer.host.numel() * dtype_size(buffer.host.dtype());
  }
  return total;
}

}  // namespace weft
