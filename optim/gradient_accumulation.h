// Gradient accumulation: one optimizer step from several micro-batches.
//
// Nothing special is needed to accumulate: each backward adds into every parameter's .grad (the
// autograd engine's leaf accumulation is +=), and the optimizer reads .grad only at step(). A step
// over N micro-batches is therefore
//
//   optimizer.zero_grad();
//   for (micro_batch : N micro-batches) loss(micro_batch).backward();   // .grad = sum of N gradients
//   scale_gradients(parameters, 1.0 / N);                               // now the mean over the batch
//   clip_grad_norm(parameters, max_norm);  optimizer.step(lr);
//
// When each micro-batch loss is a mean over its own (equal-sized) samples, scaling the summed
// gradients by 1/N gives exactly the full-batch mean gradient. Dividing each loss by N before its
// backward does the same and makes scale_gradients unnecessary; pick one, not both.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace weft {

// Multiplies every defined .grad of `parameters` by `factor`, in place, on its device (one
// Backend::scale_in_place call per device).
void scale_gradients(const std::vector<Tensor>& parameters, double factor);

// The defined, non-empty .grad of each parameter, grouped by device in first-seen order (for
// whole-model calls such as Backend::squared_norms and scale_in_place, one per device).
struct DeviceGradients {
  Device device;
  std::vector<Tensor> grads;
};
std::vector<DeviceGradients> gradients_by_device(const std::vector<Tensor>& parameters);

}  // namespace weft
