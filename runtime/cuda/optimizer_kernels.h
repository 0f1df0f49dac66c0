// Multi-tensor optimizer updates on the GPU: one launch updates every parameter in a list.
//
// AdamW exactly as optim/adamw.h states it (and as the CPU loop computes it, in f32):
//   p = p * decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p = p - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// with the per-parameter scalars computed on the host in double (decay = 1 - lr wd, step_size =
// lr / (1 - b1^t), bias_correction2_sqrt = sqrt(1 - b2^t)) and rounded once to f32. A bf16/f16
// parameter is updated through its f32 master copy (and restarts from the parameter where the
// two disagree, as the CPU does). Gradients may be f32, bf16 or f16; state is f32.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace weft::cuda {

struct AdamWTensorUpdate {
  Tensor parameter;   // [..] f32/bf16/f16, contiguous, CUDA
  Tensor grad;        // parameter's shape, f32/bf16/f16, contiguous
  Tensor exp_avg;     // parameter's shape, f32
  Tensor exp_avg_sq;  // parameter's shape, f32
  Tensor master;      // f32 copy for a 16-bit parameter; undefined for f32
  double step_size = 0;
  double bias_correction2_sqrt = 1;
  double decay = 1;
};

// Updates every entry in one kernel launch on the current stream of their (common) device.
void adamw_multi_tensor(const std::vector<AdamWTensorUpdate>& updates, double beta1, double beta2, double eps);

// SGD with momentum exactly as optim/sgd.h's CPU loop computes it, in f32:
//   d = g + weight_decay p;  b = momentum b + d (when momentum != 0);
//   d = nesterov ? d + momentum b : b;  p = p - lr d
// with the same master-weight rule as AdamW.
struct SgdTensorUpdate {
  Tensor parameter;        // [..] f32/bf16/f16, contiguous, CUDA
  Tensor grad;             // parameter's shape, f32/bf16/f16, contiguous
  Tensor momentum_buffer;  // parameter's shape, f32; undefined when momentum is 0
  Tensor master;           // f32 copy for a 16-bit parameter; undefined for f32
  double lr = 0;
  double weight_decay = 0;
};

// Updates every entry in one kernel launch on the current stream of their (common) device.
void sgd_multi_tensor(const std::vector<SgdTensorUpdate>& updates, double momentum, bool nesterov);

}  // namespace weft::cuda
