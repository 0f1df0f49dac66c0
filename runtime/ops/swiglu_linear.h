// Differentiable gated linear pair: a SwiGLU MLP's two input projections and its activation as one
// op, so that the backward can compute both weight gradients with one batched product.
//
// swiglu_linear(x [..., C], gate_weight [H, C], up_weight [H, C]) -> [..., H]
//   = swiglu(linear(x, gate_weight), linear(x, up_weight)) = silu(x Wg^T) * (x Wu^T), no biases.
//
// Why one op: the two weight gradients dWg = dG^T X and dWu = dU^T X are [H, C] products over all
// the rows. Each alone (Llama 1B: [5504, 2048] over 16,384 rows) runs at 76-82% of the bf16
// ceiling on the H200; the two as one batched product [2, H, C] ran 9-14% faster
// (docs/performance.md). When the two weights' .grad lie one right after the other in one storage
// (a gradient buffer keeps them so: Module::keep_gradients_adjacent), the backward writes both with
// that one product; otherwise with one product each, exactly as two linears would.
//
// Forward: Backend::swiglu_products, the two products into one [2, R, H] buffer (gate first) and
// swiglu from it, which a backend may run as one product (weft's own on Hopper). Saved:
// x's rows, the weights and that buffer (what two linears and swiglu save together). Backward:
// Backend::swiglu_backward into one [2, R, H] buffer, dX = dG Wg + dU Wu (the second product adds
// into the first's result, and a gradient x already has, Llama's residual-stream norm output being
// read by nothing else, is added by the first), then the weight gradients now or, under a
// DeferWeightGradients, later (zero-bubble pipelines). The output can be rebuilt from the saved
// buffer (train.recompute selective).
//
// x, gate_weight, up_weight: one floating dtype and device; the weights of one shape [H, C] with C
// x's last size.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor swiglu_linear(const Tensor& x, const Tensor& gate_weight, const Tensor& up_weight);

}  // namespace weft
