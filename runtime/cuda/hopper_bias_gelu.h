// weft's own Hopper product (runtime/cuda/hopper_gemm.cuh) for a linear layer's bias + GELU forward:
// where it is switched on, CudaBackend::matmul_bias_gelu sends the products it can take here instead
// of to cuBLASLt's GELU_AUX_BIAS epilogue. Measured 6-12% faster than cuBLASLt's on the 1.3B shape's
// up-projection and 5-10% on GPT-2's (docs/performance.md, 2026-12-05, fifteenth session).
//
// Off by default; WEFT_HOPPER_GEMM=1 switches it on (read once), and tests switch it directly. Its
// results are not cuBLASLt's bits: GELU's tanh is the hardware's approximation (2^-11 relative,
// under bf16's rounding), and the sums run in another order. It is deterministic: the same inputs
// give the same bits on every run.
//
// Built for sm_90a only (runtime/cuda/sm90a/, an object library of its own: a build for sm_90 would
// compile the kernel to nothing); on any other device it declines and cuBLASLt runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace weft::cuda {

// out [m, n] = gelu(a [m, k] · b [n, k]ᵀ + bias [n]) and pre_gelu [m, n] = a · bᵀ + bias (or null:
// not kept), bf16, every matrix contiguous and row-major, on the current device, queued on stream.
// False (nothing queued) where it does not apply: the device is not compute capability 9.0, a
// dimension is 0, k or n is not a multiple of 8, a pointer is not 16-byte aligned, or a dimension
// does not fit a 32-bit index.
bool hopper_bias_gelu(const void* a, const void* b, const void* bias, void* out, void* pre_gelu, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream);

// Whether matmul_bias_gelu tries hopper_bias_gelu first (WEFT_HOPPER_GEMM=1 at the first call).
bool hopper_gemm_enabled();
void set_hopper_gemm_enabled(bool enabled);
// How many products hopper_bias_gelu has queued in this process (for tests: that it ran).
int64_t hopper_gemm_launches();

}  // namespace weft::cuda
