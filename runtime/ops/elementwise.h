// Differentiable elementwise ops.
//
// Binary ops broadcast their operands (numpy rules) and require one dtype and one device; the
// error names the op and both operands. Unary activations keep shape and dtype. gelu is the tanh
// approximation used by GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// x * factor.
Tensor scale(const Tensor& x, double factor);
// x + value.
Tensor add_scalar(const Tensor& x, double value);
Tensor neg(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);

}  // namespace weft
