// silu, its derivative and SwiGLU of one f32 value, written once for every CUDA kernel that applies
// them: the elementwise op (UnaryOp::kSilu), the SwiGLU passes (swiglu.cu) and weft's own Hopper
// product's SwiGLU epilogues (hopper_gemm.cuh). Those must agree bit for bit: a layer that rebuilds
// its output from the kept gate and up (train.recompute: selective) must get what the forward stored,
// and the fused epilogues stand in for the passes. expf and IEEE divides (no fast-math), each
// product rounded once, in the expression order of silu then mul.
#pragma once

#include <cuda_runtime.h>

namespace weft::cuda {

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float silu_derivative(float x) {
  const float sigmoid = 1.0f / (1.0f + expf(-x));
  return sigmoid * (1.0f + x * (1.0f - sigmoid));
}

// silu(gate) · up.
__device__ __forceinline__ float swiglu_value(float gate, float up) { return __fmul_rn(silu(gate), up); }

// SwiGLU's backward from gate and up alone: grad_up = grad · silu(gate), grad_gate = (grad · up) ·
// silu'(gate).
__device__ __forceinline__ void swiglu_gradients(float gate, float up, float grad, float& grad_gate, float& grad_up) {
  grad_up = __fmul_rn(grad, silu(gate));
  grad_gate = __fmul_rn(__fmul_rn(grad, up), silu_derivative(gate));
}

}  // namespace weft::cuda
