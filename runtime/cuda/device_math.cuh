// Device-side element conversions and dtype dispatch for CUDA kernels.
//
// Kernels are templates over the stored element type T (float, __nv_bfloat16, __half) and compute
// in float: to_float(T) widens, from_float<T>(float) rounds to nearest even (the hardware
// conversions, which match weft::BFloat16 / weft::Float16 on the host). dispatch_cuda_floating
// instantiates a host-side lambda body for the stored type of a floating dtype (f64 is not a CUDA
// compute dtype: the CUDA backend raises weft::Error naming the op for f64 and integer tensors).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string_view>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace weft::cuda {

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
__device__ __forceinline__ float to_float(__half value) { return __half2float(value); }

template <class T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ float from_float<float>(float value) { return value; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }
template <>
__device__ __forceinline__ __half from_float<__half>(float value) { return __float2half_rn(value); }

template <class Body>
void dispatch_cuda_floating(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case kFloat32: body.template operator()<float>(); return;
    case kBFloat16: body.template operator()<__nv_bfloat16>(); return;
    case kFloat16: body.template operator()<__half>(); return;
    default:
      WEFT_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported on CUDA (expected f32, bf16 or f16)");
  }
}

// Blocks of `threads` covering `count` elements, capped so the grid stays launchable (kernels loop).
inline unsigned int grid_for(long long count, int threads) {
  long long blocks = (count + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;
  return static_cast<unsigned int>(blocks);
}

}  // namespace weft::cuda
