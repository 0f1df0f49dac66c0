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
//
// Handing over the backward: an op that consumes the rotated tensor as its one use (causal
// attention, ops/attention.cc) may un-rotate the gradient it computes for it in place
// (unrotate_gradient_in_place), in the buffer where it wrote it; the rotary node then passes that
// gradient through as its input's. Attention writes the q, k and v gradients into one buffer laid
// out as the qkv projection's output, so the split's backward then takes them as they lie, with no
// copies (it would copy the two new buffers an ordinary rotary backward writes).
#pragma once

#include "runtime/autograd/node.h"
#include "runtime/tensor.h"

namespace weft {

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

// When `edge` (a consumer's edge for one of its inputs) leads to the output of a rotary_embedding
// whose one use is that consumer, and that node's backward has not run: `grad` ([B, H, T, D], unit
// stride in D: the gradient the consumer computed for that input) is un-rotated in place, the node
// will return it as its input's gradient, and the result is true. Else nothing happens and false.
bool unrotate_gradient_in_place(const autograd::Edge& edge, const Tensor& grad);

}  // namespace weft
