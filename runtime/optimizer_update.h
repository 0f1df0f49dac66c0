// Optimizer updates as backend kernels: one AdamW or SGD step for a list of parameters, all on one
// device, in one Backend call (Backend::adamw_update, Backend::sgd_update; one launch on CUDA).
//
// The optimizers of optim/ own the state and compute every per-parameter scalar on the host in
// double; a backend rounds each scalar once to the state dtype (as PyTorch passes Python floats to
// its kernels) and computes in the state dtype, in exactly this order:
//
//   AdamW (torch.optim.AdamW, amsgrad off), t = the parameter's own step count:
//     p = p * decay                                   decay = 1 - lr * weight_decay
//     m = beta1 * m + (1 - beta1) * g
//     v = beta2 * v + (1 - beta2) * g^2
//     p = p - step_size * (m / (sqrt(v) / bias_correction2_sqrt + eps))
//                                                     step_size = lr / (1 - beta1^t),
//                                                     bias_correction2_sqrt = sqrt(1 - beta2^t)
//   SGD (torch.optim.SGD, dampening 0):
//     d = g + weight_decay * p                        only when weight_decay != 0
//     b = momentum * b + d                            only with a momentum buffer
//     d = nesterov ? d + momentum * b : b             only with a momentum buffer
//     p = p - lr * d
//
// State dtype: f32, or f64 for f64 parameters (statistic_dtype). Gradients of another floating
// dtype are read converted to it.
//
// Master weights. A bf16/f16 parameter comes with a master that holds its f32 value: for bf16 the
// parameter is the master's high half and `master` an i16 tensor of low halves
// (runtime/split_master_weights.h: 2 bytes a parameter, exact), for f16 an f32 copy. The update
// starts from the master's value, and stores the result into the master and, rounded once, into
// the parameter (bf16: to nearest, ties away from zero, which the split needs; f16: to nearest
// even), so updates too small to move the 16-bit value accumulate in the master. Invariant: after
// each update, parameter == round(master), element by element. Where something outside the
// optimizer wrote the parameter (loaded weights, a manual edit), the parameter wins: a bf16
// element's master becomes the written value plus the low half it had (less than half a bf16 step
// from it, and rounding back to it); an f16 element, found by one compare, restarts its master
// from the written value. Either way a stale master cannot undo a weight load.
//
// Entries of one call are distinct parameters (no two share storage) on the backend's device.
//
// Guard. A call may carry a guard: one element on the device (f32 on CUDA, f32 or f64 on the CPU).
// The update is applied only if the guard is finite, and the device decides, with no host read: a
// step graph passes its loss, so a non-finite loss skips the update without stopping the host
// (the NaN policy). Without a guard the update always applies.
//
// Previous guard (AdamW). With steps in flight the host computes a step's scalars before it has
// read whether the step issued before it was skipped. A call may then carry that step's guard as
// `previous_guard` (one element on the device, like the guard): where it is not finite, the
// previous update was not applied, every count is one lower than the host assumed, and the update
// uses each entry's `_if_previous_skipped` scalars (those of count t - 1) instead. The device
// decides, with no host read, so the update is bit for bit what a step issued after the host had
// taken the skipped step's counts back computes.
//
// Gradient scale (AdamW). A call may carry a gradient scale: one element on the device (f32 on
// CUDA, f32 or f64 on the CPU), rounded to the state dtype; every gradient is read as g * scale
// (in the state dtype) and is not written. Gradient clipping passes its factor
// (Backend::clip_factor) this way: the same update as clipping the gradients in place first, for
// f32 gradients bit for bit, without the pass that reads and writes every gradient (for 16-bit
// gradients the product is not rounded to 16 bits first).
#pragma once

#include <string>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace weft {

struct AdamWTensorUpdate {
  Tensor parameter;   // [..] f32, bf16, f16 (f64 on the CPU), contiguous; updated in place
  Tensor grad;        // parameter's shape, contiguous, floating (CUDA: f32, bf16 or f16)
  Tensor exp_avg;     // parameter's shape, contiguous, state dtype; updated in place
  Tensor exp_avg_sq;  // parameter's shape, contiguous, state dtype; updated in place
  Tensor master;      // parameter's shape, contiguous: i16 low halves for bf16, f32 for f16, undefined otherwise
  double step_size = 0.0;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1.0;  // sqrt(1 - beta2^t)
  double decay = 1.0;                  // 1 - lr * weight_decay
  // The same for count t - 1, used where the previous guard is not finite (t >= 2 then).
  double step_size_if_previous_skipped = 0.0;
  double bias_correction2_sqrt_if_previous_skipped = 1.0;
};

// The scalars every parameter of an AdamW step shares.
struct AdamWHyperparameters {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  Tensor guard;       // undefined, or one element: the update applies only if it is finite
  Tensor gradient_scale;  // undefined, or one element: every gradient is read multiplied by it
  Tensor previous_guard;  // undefined, or one element: the step in flight before this one's guard
};

struct SgdTensorUpdate {
  Tensor parameter;        // [..] f32, bf16, f16 (f64 on the CPU), contiguous; updated in place
  Tensor grad;             // parameter's shape, contiguous, floating (CUDA: f32, bf16 or f16)
  Tensor momentum_buffer;  // parameter's shape, contiguous, state dtype; undefined exactly when momentum is 0
  Tensor master;           // parameter's shape, contiguous: i16 low halves for bf16, f32 for f16, undefined otherwise
  double lr = 0.0;
  double weight_decay = 0.0;  // this parameter's group's
};

// The scalars every parameter of an SGD step shares.
struct SgdHyperparameters {
  double momentum = 0.0;
  bool nesterov = false;
  Tensor guard;       // as AdamWHyperparameters::guard
};

// Checks the operands of Backend::join_master_halves and master_low_halves (`high` undefined for
// the second): values f32, low i16, high bf16, all contiguous, of one shape, on `device`.
inline void check_master_halves(const char* op, Device device, const Tensor& values, const Tensor& low,
                                const Tensor& high = Tensor()) {
  const bool fits = values.dtype() == kFloat32 && low.dtype() == kInt16 && values.is_contiguous() &&
                    low.is_contiguous() && values.shape() == low.shape() && values.device() == device &&
                    low.device() == device &&
                    (!high.defined() || (high.dtype() == kBFloat16 && high.is_contiguous() &&
                                         high.shape() == values.shape() && high.device() == device));
  WEFT_CHECK(fits, op, ": expected contiguous f32 values, i16 low halves",
             high.defined() ? " and bf16 high halves" : "", " of one shape on ", device.to_string(), "; got ", values.describe(), ", ", low.describe(),
             high.defined() ? ", " + high.describe() : std::string());
}

}  // namespace weft
