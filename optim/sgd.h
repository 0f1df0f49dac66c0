// SGD's per-parameter update, exactly as torch.optim.SGD (dampening 0) computes it:
//
//   d = g + weight_decay * p                 L2 regularization, PyTorch's SGD convention
//   b = momentum * b + d                     (the buffer starts at zero, so the first b is d)
//   d = nesterov ? d + momentum * b : b      (momentum 0: d is used as is)
//   p = p - lr * d
//
// The Optimizer made by make_sgd (optimizer.h) owns the state, turns each parameter with a
// gradient into a runtime/optimizer_update.h SgdTensorUpdate and makes one Backend::sgd_update call
// per device: the CPU backend's loops, or one multi-tensor launch on CUDA. State
// "<name>.momentum_buffer" (when momentum is not 0) and, for bf16/f16 parameters, "<name>.master".
#pragma once

#include "runtime/tensor.h"

namespace weft {

struct SgdStep {
  double lr = 0.0;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
};

// parameter [..] (any floating dtype, contiguous), updated in place.
// grad: parameter's shape, any floating dtype (converted to the state dtype).
// momentum_buffer: parameter's shape, contiguous, f32 (f64 for f64 parameters), updated in place;
// undefined when momentum is 0.
// master: make_master_weights(parameter) (master_weights.h: i16 low halves for bf16, an f32 copy for
// f16), undefined for other dtypes.
// Every tensor on the parameter's device; a device without an optimizer kernel is a weft::Error.
// One parameter's update through its device's backend (the optimizer batches a device's parameters
// into one call instead).
void sgd_update(const Tensor& parameter, const Tensor& grad, const Tensor& momentum_buffer, const Tensor& master,
                const SgdStep& step);

}  // namespace weft
