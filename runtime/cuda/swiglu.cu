// CUDA kernels: SwiGLU's activation silu(gate) * up and its backward, one pass each.
//
// What they compute is runtime/backend.h's swiglu contract; the reference is runtime/cpu/swiglu.cc,
// and silu and its derivative are runtime/cuda/silu.cuh's, shared with elementwise.cu's UnaryOp::kSilu.
// The forward reads gate and up and writes out; the backward reads gate, up and grad_out and writes
// grad_gate and grad_up, recomputing silu(gate) in registers, so no [.., hidden] activation is
// saved for it and the unfused path's four elementwise passes each way become one. Every operand
// is contiguous: 16-byte packs when every pointer is 16-byte aligned, the last count % pack
// elements one by one (and every element one by one otherwise).
//
// Launched as programmatic dependents (dependent_launch.cuh), after the gate/up matmuls.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/silu.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Elements [start, start + kPack) of every operand (kPack == 1: one element, any alignment).
template <class T, int kPack>
__device__ __forceinline__ void swiglu_pack(const T* gate, const T* up, T* out, int64_t start) {
  const Pack<T, kPack> g = load_pack_streaming<T, kPack>(gate + start);
  const Pack<T, kPack> u = load_pack_streaming<T, kPack>(up + start);
  Pack<T, kPack> result;
#pragma unroll
  for (int k = 0; k < kPack; ++k) result.set(k, swiglu_value(g.get(k), u.get(k)));
  store_pack<T, kPack>(out + start, result);
}

template <class T, int kPack>
__device__ __forceinline__ void swiglu_backward_pack(const T* gate, const T* up, const T* grad_out, T* grad_gate,
                                                     T* grad_up, int64_t start) {
  const Pack<T, kPack> g = load_pack_streaming<T, kPack>(gate + start);
  const Pack<T, kPack> u = load_pack_streaming<T, kPack>(up + start);
  const Pack<T, kPack> gy = load_pack_streaming<T, kPack>(grad_out + start);
  Pack<T, kPack> gg, gu;
#pragma unroll
  for (int k = 0; k < kPack; ++k) {
    float grad_gate, grad_up;
    swiglu_gradients(g.get(k), u.get(k), gy.get(k), grad_gate, grad_up);
    gg.set(k, grad_gate);
    gu.set(k, grad_up);
  }
  store_pack<T, kPack>(grad_gate + start, gg);
  store_pack<T, kPack>(grad_up + start, gu);
}

template <class T, int kPack>
__global__ void swiglu_kernel(const T* __restrict__ gate,  // [count]
                              const T* __restrict__ up,    // [count]
                              T* __restrict__ out,         // [count]
                              int64_t count) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = count / kPack;
  for (int64_t p = start; p < packs; p += step) swiglu_pack<T, kPack>(gate, up, out, p * kPack);
  for (int64_t i = packs * kPack + start; i < count; i += step) swiglu_pack<T, 1>(gate, up, out, i);
}

template <class T, int kPack>
__global__ void swiglu_backward_kernel(const T* __restrict__ gate,      // [count]
                                       const T* __restrict__ up,        // [count]
                                       const T* __restrict__ grad_out,  // [count]
                                       T* __restrict__ grad_gate,       // [count]
                                       T* __restrict__ grad_up,         // [count]
                                       int64_t count) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = count / kPack;
  for (int64_t p = start; p < packs; p += step) {
    swiglu_backward_pack<T, kPack>(gate, up, grad_out, grad_gate, grad_up, p * kPack);
  }
  for (int64_t i = packs * kPack + start; i < count; i += step) {
    swiglu_backward_pack<T, 1>(gate, up, grad_out, grad_gate, grad_up, i);
  }
}

bool aligned16(const Tensor& tensor) { return reinterpret_cast<uintptr_t>(tensor.raw_data()) % 16 == 0; }

cudaStream_t prepare(const Tensor& tensor) {
  const int device = tensor.device().index;
  set_device(device);
  return current_stream(device);
}

}  // namespace
}  // namespace cuda

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t count = out.numel();
  if (count == 0) return;
  const cudaStream_t stream = cuda::prepare(out);
  cuda::dispatch_cuda_floating(gate.dtype(), "swiglu", [&]<class T>() {
    constexpr int kPack = cuda::kPackSize<T>;
    const bool packed = cuda::aligned16(gate) && cuda::aligned16(up) && cuda::aligned16(out);
    const int64_t work = packed ? std::max<int64_t>(count / kPack, 1) : count;
    auto* kernel = packed ? cuda::swiglu_kernel<T, kPack> : cuda::swiglu_kernel<T, 1>;
    cuda::launch_dependent(kernel, cuda::grid_for(work, cuda::kThreads), cuda::kThreads, 0, stream, gate.data<T>(),
                           up.data<T>(), out.data<T>(), count);
  });
}

void CudaBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out,
                                  const Tensor& grad_gate, const Tensor& grad_up) {
  const int64_t count = gate.numel();
  if (count == 0) return;
  const cudaStream_t stream = cuda::prepare(gate);
  cuda::dispatch_cuda_floating(gate.dtype(), "swiglu_backward", [&]<class T>() {
    constexpr int kPack = cuda::kPackSize<T>;
    const bool packed = cuda::aligned16(gate) && cuda::aligned16(up) && cuda::aligned16(grad_out) &&
                        cuda::aligned16(grad_gate) && cuda::aligned16(grad_up);
    const int64_t work = packed ? std::max<int64_t>(count / kPack, 1) : count;
    auto* kernel = packed ? cuda::swiglu_backward_kernel<T, kPack> : cuda::swiglu_backward_kernel<T, 1>;
    cuda::launch_dependent(kernel, cuda::grid_for(work, cuda::kThreads), cuda::kThreads, 0, stream, gate.data<T>(),
                           up.data<T>(), grad_out.data<T>(), grad_gate.data<T>(), grad_up.data<T>(), count);
  });
}

}  // namespace weft
