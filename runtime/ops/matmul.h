// Differentiable matrix products.
//
// matmul(a [..., M, K], b [..., K, N]) -> [..., M, N]; batch dims broadcast, and a 2-D operand is
// shared by every batch without a copy. Transposed views are passed to BLAS as they are (no copy).
// linear(x [..., In], weight [Out, In], bias [Out] or undefined) -> [..., Out] = x weight^T + bias,
// the convention of torch.nn.Linear.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace weft
