// Differentiable normalization over the last dim.
//
// layer_norm(x [..., C], weight [C], bias [C] or undefined) = (x - mean) / sqrt(var + eps) * weight
// + bias, with the biased variance (as torch.nn.LayerNorm). rms_norm(x [..., C], weight [C]) =
// x / sqrt(mean(x^2) + eps) * weight. Both give gradients for x, weight and bias.
//
// add_layer_norm(x [..., C], residual [..., C] (same shape and dtype), weight, bias, eps) -> (sum, out):
// sum = x + residual and out = layer_norm(sum, weight, bias, eps) as one op, the pre-norm residual
// step of a transformer block. On CUDA one kernel reads x and residual once and writes both outputs
// (Backend::add_layer_norm). Gradients: d sum = grad_sum + layer_norm's input gradient, which flows
// to x and residual alike; weight and bias as layer_norm.
#pragma once

#include <utility>

#include "runtime/tensor.h"

namespace weft {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                         const Tensor& bias, double eps = 1e-5);

}  // namespace weft
