// Differentiable matrix products.
//
// matmul(a [..., M, K], b [..., K, N]) -> [..., M, N]; batch dims broadcast, and a 2-D operand is
// shared by every batch without a copy. Transposed views are passed to BLAS as they are (no copy).
// linear(x [..., In], weight [Out, In], bias [Out] or undefined) -> [..., Out] = x weight^T + bias,
// the convention of torch.nn.Linear.
// linear_gelu(x, weight, bias) = gelu(linear(x, weight, bias)) (tanh form) as one op: on CUDA the bias
// and GELU ride the product's cuBLASLt epilogue (Backend::matmul_bias_gelu), which also keeps the
// pre-activation for the backward. Without a bias it is gelu(linear(x, weight)).
// linear_add(x, weight, bias, residual [..., Out]) = residual + linear(x, weight, bias) as one op: on
// CUDA the product reads the residual as its C matrix (Backend::matmul_bias_add), so a block's
// output projection and the residual stream's add are one kernel. The residual's gradient is the
// output's, passed through.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual);

}  // namespace weft
