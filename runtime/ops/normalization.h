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
// to x and residual alike; weight and bias as layer_norm. add_rms_norm is the same with rms_norm.
//
// Backward passes fold work into the norm's kernel (Backend's NormBackwardExtras): grad_sum is
// added in the pass that writes d sum; a plain norm adds the gradient its input already received
// from the engine (autograd::take_pending_gradient: the residual stream's) into grad_x; and where
// weight and bias are leaves whose .grad exists, their gradients are accumulated into it directly.
#pragma once

#include <utility>

#include "runtime/tensor.h"

namespace weft {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                         const Tensor& bias, double eps = 1e-5);
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                       double eps = 1e-6);

}  // namespace weft
