// silu, its derivative and SwiGLU of one f32 value, written once for every CUDA kernel that applies
// them: the elementwise op (UnaryOp::kSilu), the SwiGLU passes (swiglu.cu) and weft's own Hopper
// product's SwiGLU epilogues (hopper_gemm.cuh). Those must agree bit for bit: a layer that rebuilds
// its output from the kept gate and up (train.recompute: selective) must get what the forward stored,
// and the fused epilogues stand in for the passes. The sigmoid takes the hardware's approximations
// (ex2.approx and rcp.approx: a few f32 ulps, far under bf16's rounding and the f32 tests' 1e-5
// against the CPU's IEEE expf and divides): about 50 instructions a SwiGLU-backward element with
// IEEE expf and two IEEE divides, which the own product's epilogue, one warp a scheduler beside the
// other warpgroup's products, could not hide (docs/performance.md, 2026-12-06, eighteenth session).
// Each product rounded once, in the expression order of silu then mul.
#pragma once

#include <cuda_runtime.h>

namespace weft::cuda {

// 1 / (1 + e^-x): 0 for x below about -88 (e^-x is then infinite), 1 for x above about 17.
// Every step written as an intrinsic, so that no context contracts it differently (the bits are shared).
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, __fadd_rn(1.0f, __expf(-x))); }

__device__ __forceinline__ float silu(float x) { return __fmul_rn(x, sigmoid(x)); }

__device__ __forceinline__ float silu_derivative(float x) {
  const float s = sigmoid(x);
  return __fmul_rn(s, __fmaf_rn(x, __fsub_rn(1.0f, s), 1.0f));
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
