// The hand-off of SwiGLU's gradients from the linear that reads its output (a SwiGLU MLP's down
// projection) to the op that produced it (swiglu_linear). The linear's dX product can apply
// SwiGLU's backward in its epilogue (Backend::matmul_swiglu_backward) and hand the producer its
// gate and up gradients instead of the gradient of its output: the [R, H] gradient of the output is
// then never written and read back (on Hopper, weft's own product does this; docs/performance.md,
// 2026-12-06). It is the SwiGLU counterpart of the GELU linear's hand-off of dPre in matmul.cc.
//
// Invariants: the linear asks only while the producer's output has one use (Node::output_uses:
// nothing else adds to that gradient); the producer agrees only while its gate and up are saved.
// The gradients handed are what the producer's backward computes from the product (the default
// Backend::matmul_swiglu_backward is its product and swiglu_backward, exactly), so the hand-off
// changes where the work runs, not the result.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace weft {

class SwigluGradientProducer {
 public:
  virtual ~SwigluGradientProducer() = default;

  // What the linear's product reads and writes: gate and up [R, H] as the producer saved them, and
  // the [R, H] halves of the gradient buffer the producer's backward will use.
  struct Handoff {
    Tensor gate, up, grad_gate, grad_up;
  };
  // Gradients for output rows [rows, hidden] of this dtype. Undefined members where the producer
  // cannot take them (its saved tensors are gone, or the shape or dtype differ). Once it has
  // answered with defined ones, its next backward uses those gradients and ignores the gradient of
  // its output that it receives.
  virtual Handoff take_gradients_from_next_product(DType dtype, int64_t rows, int64_t hidden) = 0;
};

}  // namespace weft
