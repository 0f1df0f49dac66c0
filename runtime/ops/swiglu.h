// Differentiable SwiGLU activation (Shazeer 2020), the gated MLP of Llama.
//
// swiglu(gate [...], up [...]) -> [...] = silu(gate) * up, silu(x) = x / (1 + exp(-x)), as one op:
// one kernel forward (Backend::swiglu) and one backward (Backend::swiglu_backward) that computes
// both gradients from gate and up, which are all it saves: silu(gate) is recomputed in the
// backward rather than kept, so the MLP holds two [.., hidden] activations for its backward
// instead of three. f32 and f64 results equal silu then mul bit for bit; 16-bit dtypes round once.
//
// gate and up have one shape, dtype and device (no broadcasting); non-contiguous inputs are copied.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace weft
