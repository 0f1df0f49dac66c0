// Matrix products on CUDA through cuBLASLt, beyond the Backend interface: fused bias and GELU
// epilogues for linear layers, and a residual read as the C matrix (CudaBackend::matmul in matmul.cu
// is the plain product).
//
// Shapes as for Backend::matmul: a [B, M, K], bm [B, K, N], out [B, M, N] contiguous, a and bm
// row-major or transposed views; for these calls the batch must fold into rows (B == 1, or bm shared
// with batch stride 0 and a's batches packed), which is the linear-layer case. bias [N] contiguous,
// of out's dtype (f32, bf16 or f16). GELU is the tanh form (UnaryOp::kGelu), as cuBLASLt computes it.
#pragma once

#include "runtime/tensor.h"

namespace weft::cuda {

// out = a @ bm + bias.
void matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out);

// out = a @ bm + bias + addend (bias undefined: none); addend [B, M, N] contiguous, out's dtype, read as
// cuBLASLt's C with beta 1 (C is not D: out is written, addend only read).
void matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& addend, const Tensor& out);

// out = gelu(a @ bm + bias). pre_gelu, when defined ([B, M, N] contiguous, out's dtype, N a multiple
// of 8), receives a @ bm + bias for the backward pass.
void matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                      const Tensor& pre_gelu = Tensor());

// out = gelu'(pre_gelu) * (a @ bm): the backward of a GELU linear through the product after it
// (pre_gelu [B, M, N] contiguous, out's dtype, N a multiple of 8, as matmul_bias_gelu wrote it).
void matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_gelu, const Tensor& out);

}  // namespace weft::cuda
