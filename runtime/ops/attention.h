// Differentiable causal scaled dot-product self-attention.
//
// q [B, H, T, D], k, v [B, KV, T, D] -> out [B, H, T, D]: out = softmax(q k^T * scale + causal mask) v,
// where position t attends to positions 0..t. Grouped-query attention without copies: KV divides H
// and query head h reads kv head h / (H / KV) (KV = H is multi-head attention, KV = 1 multi-query);
// the gradients of k and v are shaped like k and v (sums over each kv head's group of query heads).
// Any head dim D (CUDA: 1..256). scale defaults (when <= 0) to 1/sqrt(D). The CPU kernel may
// materialise T x T scores; device kernels must not. q, k, v may be any [B, H, T, D] views (the
// heads of one [B, T, 3, H, D] projection go to the backend without a copy); out is a [B, H, T, D]
// view stored in [B, T, H, D] order, so out.permute({0, 2, 1, 3}) is contiguous and merging the heads
// is free.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0);

}  // namespace weft
