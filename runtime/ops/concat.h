// Differentiable concatenation and splitting along one dim.
//
// concat joins tensors that agree in every other dim (one dtype, one device). split returns views
// of consecutive pieces with the given sizes (they must add up to the dim's size); its gradient is
// the concatenation of the pieces' gradients (zeros for pieces that got none).
#pragma once

#include <vector>

#include "absl/types/span.h"
#include "runtime/tensor.h"

namespace weft {

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& x, absl::Span<const int64_t> sizes, int64_t dim);

}  // namespace weft
