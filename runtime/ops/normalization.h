// Differentiable normalization over the last dim.
//
// layer_norm(x [..., C], weight [C], bias [C] or undefined) = (x - mean) / sqrt(var + eps) * weight
// + bias, with the biased variance (as torch.nn.LayerNorm). rms_norm(x [..., C], weight [C]) =
// x / sqrt(mean(x^2) + eps) * weight. Both give gradients for x, weight and bias.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

}  // namespace weft
