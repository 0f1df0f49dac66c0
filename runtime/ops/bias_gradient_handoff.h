// The hand-off of a linear's bias gradient to the op whose backward writes the linear's output
// gradient. A linear's bias gradient is the column sums of its output gradient dY [R, N]. Where a
// norm's backward writes dY, the norm's kernel sums grad_x's columns as it writes them
// (NormBackwardExtras::grad_x_column_sums), and the linear's dX product then runs without the sums,
// which on CUDA cost it more than they cost the norm (docs/performance.md, 2026-12-07). In GPT's
// blocks: the attention output projection's output is add_layer_norm's residual, whose gradient is
// the sum's that the fused norm writes; the MLP output projection (linear_add) ends its block, and
// the next block's first norm writes its gradient. Each block is a step-graph segment whose input
// is a detached leaf, whose gradient the step builder hands unchanged to the segment below as its
// output's (parallel/step/step_builder.h): the norm reaches the projection through
// autograd::gradient_destination, and its sums wait in the projection until that backward.
//
// Invariants: the writer asks only when the gradient it returns is all that the linear's output
// receives (autograd::receives_only_this_gradient) and only where its backend sums the columns in
// the same pass (Backend::norm_backward_sums_columns_in_pass); the linear agrees only where it would
// take the bias gradient with dX anyway (a bias that takes a gradient, no GELU between the product
// and dY, no deferral of the weight gradients when asked; a deferral begun by its own backward
// keeps the handed sums with the weight's deferred gradient). The sums written are those of dY as
// stored, summed in f32 and rounded once, as Backend::matmul_and_column_sums computes them: the
// hand-off changes where the work runs, not what is computed.
#pragma once

#include <atomic>
#include <cstdint>

#include "runtime/tensor.h"

namespace weft {

class BiasGradientTaker {
 public:
  virtual ~BiasGradientTaker() = default;

  // A [columns] tensor of `dtype` for the caller to write with the column sums of the gradient it
  // returns for this node's output ([..., columns]); undefined where this node does not take it.
  // Once it has answered with a defined one, its next backward uses that tensor as its bias
  // gradient.
  virtual Tensor take_bias_gradient_from_output_gradient(DType dtype, int64_t columns) = 0;
};

// How many bias gradients linears have taken this way since the process started: for tests and
// diagnostics (that a model's step hands them off where it should). Takers add one per hand-off.
inline std::atomic<int64_t> bias_gradient_handoff_count{0};

}  // namespace weft
