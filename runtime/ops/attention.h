// Differentiable causal scaled dot-product self-attention.
//
// q, k, v [B, H, T, D] -> out [B, H, T, D]: out = softmax(q k^T * scale + causal mask) v, where
// position t attends to positions 0..t. scale defaults (when <= 0) to 1/sqrt(D). The CPU kernel may
// materialise T x T scores; device kernels must not.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0);

}  // namespace weft
