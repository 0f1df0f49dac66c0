// f32 scratch for the CPU kernels that compute 16-bit tensors in f32 (matmul, attention): widen the
// inputs once, compute into an f32 output, round once on the way back. f32 and f64 tensors pass
// through untouched, so a kernel can call these unconditionally.
#pragma once

#include "runtime/tensor.h"

namespace weft::cpu {

// x itself when it is f32 or f64; else a contiguous f32 copy of it.
Tensor widened_to_f32(const Tensor& x);

// out itself when it is f32 or f64; else a fresh f32 tensor of its shape to compute into.
Tensor f32_output_for(const Tensor& out);

// Rounds `computed` into `out` when they differ (f32_output_for made a scratch); else nothing.
void store_from_f32(const Tensor& computed, const Tensor& out);

}  // namespace weft::cpu
