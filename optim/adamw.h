// AdamW's per-parameter update, exactly as torch.optim.AdamW (amsgrad off) computes it:
//
//   t     = this parameter's step count, after incrementing (1 on the first update)
//   p     = p * (1 - lr * weight_decay)                  decoupled decay, not added to g
//   m     = beta1 * m + (1 - beta1) * g
//   v     = beta2 * v + (1 - beta2) * g^2
//   p     = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// The Optimizer made by make_adamw (optimizer.h) owns the state, turns each parameter with a
// gradient into a runtime/optimizer_update.h AdamWTensorUpdate (the scalars above, in double) and
// makes one Backend::adamw_update call per device: the CPU backend's loops, or one multi-tensor
// launch on CUDA. State "<name>.exp_avg", "<name>.exp_avg_sq" and "<name>.step" (PyTorch's names)
// and, for bf16/f16 parameters, "<name>.master" (the f32 master values, master_weights.h).
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace weft {

struct AdamWStep {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // t above, >= 1
};

// parameter [..] (any floating dtype, contiguous), updated in place.
// grad: parameter's shape, any floating dtype (converted to the state dtype).
// exp_avg, exp_avg_sq: parameter's shape, contiguous, f32 (f64 for f64 parameters), updated in place.
// master: make_master_weights(parameter) (master_weights.h: i16 low halves for bf16, an f32 copy for
// f16), undefined for other dtypes.
// Every tensor on the parameter's device; a device without an optimizer kernel is a weft::Error.
// One parameter's update through its device's backend (the optimizer batches a device's parameters
// into one call instead).
void adamw_update(const Tensor& parameter, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                  const Tensor& master, const AdamWStep& step);

}  // namespace weft
