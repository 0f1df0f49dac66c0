// Global gradient-norm clipping (gradient_clipping.h).
#include "optim/gradient_clipping.h"

#include <cmath>

#include "optim/gradient_accumulation.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"

namespace weft {

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
  autograd::NoGradGuard no_grad;
  // Per device, one Backend::squared_norms call over all its gradients (one pass over each, no
  // widened copies; on CUDA two launches for the whole model) and one read back: one host
  // synchronization per device and call, in the device's accumulation_dtype.
  double sum_of_squares = 0.0;
  for (const DeviceGradients& group : gradients_by_device(parameters)) {
    const Tensor squares =
        Tensor::empty({static_cast<int64_t>(group.grads.size())}, accumulation_dtype(group.device), group.device);
    backend_for(group.device).squared_norms(group.grads, squares);
    for (double value : squares.to(Device::cpu()).to_vector()) sum_of_squares += value;
  }
  const double norm = std::sqrt(sum_of_squares);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    scale_gradients(parameters, max_norm / (norm + 1e-6));
  }
  return norm;
}

}  // namespace weft
