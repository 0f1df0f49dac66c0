// linear_parameter_gradients (linear_parameter_gradients.h).
#include "runtime/ops/linear_parameter_gradients.h"

#include "runtime/backend.h"
#include "runtime/ops/reduction.h"

namespace weft {

LinearParameterGradients linear_parameter_gradients(const Tensor& g, const Tensor& rows, bool with_bias,
                                                    autograd::AccumulateGrad* weight_accumulator) {
  LinearParameterGradients gradients;
  const Tensor storage = weight_accumulator != nullptr ? weight_accumulator->gradient_storage(g.dtype()) : Tensor();
  Backend& backend = backend_for(g.device());
  if (storage.defined()) {
    const double beta = weight_accumulator->gradient_storage_counts_as_zero() ? 0.0 : 1.0;
    backend.matmul(g.transpose(0, 1).unsqueeze(0), rows.unsqueeze(0), storage.unsqueeze(0), 1.0, beta);
    weight_accumulator->gradient_added_in_place();
  } else {
    Tensor weight = Tensor::empty({1, g.size(1), rows.size(1)}, g.dtype(), g.device());  // [1, N, K]
    backend.matmul(g.transpose(0, 1).unsqueeze(0), rows.unsqueeze(0), weight, 1.0, 0.0);
    gradients.weight = weight.view({g.size(1), rows.size(1)});
  }
  if (with_bias) gradients.bias = sum_to_shape(g, {g.size(1)});
  return gradients;
}

}  // namespace weft
