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
  double sum_of_squares = 0.0;
  for (const Tensor& parameter : parameters) {
    const Tensor grad = parameter.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    // Through the ops, so it runs on any backend; f64 so that many small squares are not lost.
    const Tensor grad64 = grad.dtype() == kFloat64 ? grad.detach() : grad.detach().to(kFloat64);
    sum_of_squares += sum(square(grad64)).item();
  }
  const double norm = std::sqrt(sum_of_squares);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    scale_gradients(parameters, max_norm / (norm + 1e-6));
  }
  return norm;
}

}  // namespace weft
