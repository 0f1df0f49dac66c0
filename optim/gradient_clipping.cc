// Global gradient-norm clipping (gradient_clipping.h).
#include "optim/gradient_clipping.h"

#include <cmath>

#include "optim/gradient_accumulation.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduction.h"

namespace weft {

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
  autograd::NoGradGuard no_grad;
  // Per device, a running total kept on that device, read back once: one host synchronization per
  // call, not one per parameter.
  std::vector<Tensor> totals;
  for (const Tensor& parameter : parameters) {
    const Tensor grad = parameter.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    // Through the ops, so it runs on any backend. On the CPU in f64, so that many small squares
    // are not lost to a sequential f32 sum; device backends sum f32 in trees (and have no f64).
    const DType wide = grad.device().is_cpu() ? kFloat64 : kFloat32;
    const Tensor widened = grad.dtype() == wide ? grad.detach() : grad.detach().to(wide);
    const Tensor squares = sum(square(widened));
    bool added = false;
    for (Tensor& total : totals) {
      if (total.device() == squares.device() && total.dtype() == squares.dtype()) {
        total = add(total, squares);
        added = true;
      }
    }
    if (!added) totals.push_back(squares);
  }
  double sum_of_squares = 0.0;
  for (const Tensor& total : totals) sum_of_squares += total.item();
  const double norm = std::sqrt(sum_of_squares);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    scale_gradients(parameters, max_norm / (norm + 1e-6));
  }
  return norm;
}

}  // namespace weft
