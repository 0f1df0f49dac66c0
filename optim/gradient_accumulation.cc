// Scaling accumulated gradients (gradient_accumulation.h).
#include "optim/gradient_accumulation.h"

#include "runtime/backend.h"

namespace weft {

void scale_gradients(const std::vector<Tensor>& parameters, double factor) {
  for (const Tensor& parameter : parameters) {
    const Tensor grad = parameter.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    // In place through the backend so it runs wherever the gradient lives; affine is elementwise,
    // so reading and writing the same tensor is safe.
    backend_for(grad.device()).affine(grad, factor, 0.0, grad);
  }
}

}  // namespace weft
