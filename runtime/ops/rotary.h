// Differentiable rotary position embedding in the rotate-half form (layers/rope.h has the tables).
//
// rotary_embedding(x [B, H, T, D], cos [T, D], sin [T, D]) -> [B, H, T, D]:
//   x * cos + rotate_half(x) * sin,   rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])
// as one op: one kernel forward (Backend::rotary_embedding) and one backward, its transpose, where
// the unfused ops took a split, a negation, a concat, two products and a sum each way. f32 and f64
// results equal the unfused ops bit for bit; 16-bit dtypes round once.
//
// Layout: x may be any view with unit stride in D, such as the heads of one projection
// ([B, T, H, D] memory seen as [B, H, T, D]), and goes in without a copy. The result (and x's
// gradient) keeps x's order of the H and T dims in memory, so heads of a projection stay in
// [B, T, H, D] order, which the attention call reads as is and whose gradient flows back into the
// projection without a copy.
//
// cos and sin are constant tables of x's dtype and device: no gradient flows to them, and one that
// requires grad is refused. D must be even.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace weft
