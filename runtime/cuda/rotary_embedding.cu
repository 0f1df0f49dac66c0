// CUDA kernels: the rotary position embedding (rotate-half form) and its transpose, one pass each.
//
// What they compute is runtime/backend.h's rotary_embedding contract; the reference is
// runtime/cpu/rotary_embedding.cc. One thread rotates a pack of pairs: kPack consecutive elements
// of a row's first half and the kPack elements D/2 further on, with the cos/sin entries of both
// halves (16-byte loads for 8 bf16/f16 or 4 f32), and writes both packs. Products and sums use
// explicitly rounded intrinsics (__fmul_rn, __fadd_rn, __fsub_rn) so that no fused multiply-add
// changes a result: f32 equals the CPU bit for bit.
//
// Layout: x and out are [B, H, T, D] views with unit stride in D, each with its own strides, such as
// the heads of the qkv projection ([B, T, H, D] memory). Threads walk rows with the dim of the
// smaller stride (heads, for those views) innermost, so neighbouring threads touch neighbouring
// memory. The pack path needs D/2, every row stride and every base pointer to be multiples of the
// pack (16 bytes); otherwise packs of one element (D = 2, odd offsets). The tables are [T, D],
// read through L1/L2 (a few KB per position, shared by every head and sequence).
//
// Launched as programmatic dependents (dependent_launch.cuh): memory-bound and short, so the
// launch gap after the qkv matmul would be a visible part of their time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Element strides of one [B, H, T, D] operand in its first three dims (D's is 1).
struct RowStrides {
  int64_t batch, head, time;
};

struct RotaryShape {
  int64_t batch, heads, time;
  int half;            // D / 2
  bool heads_inner;    // rows are walked (b, t, h) rather than (b, h, t)
};

template <class T, int kPack, bool kTranspose>
// in and out may be one tensor (the backward in place, ops/rotary.cc): each thread reads its pair
// of packs whole before it writes them, and no other thread touches them; so they carry no
// __restrict__.
__global__ void rotary_kernel(const T* in,                 // [B, H, T, D], strides in_strides
                              RowStrides in_strides,
                              const T* __restrict__ cos,   // [T, D]
                              const T* __restrict__ sin,   // [T, D]
                              T* out,                      // [B, H, T, D], strides out_strides
                              RowStrides out_strides, RotaryShape shape) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int packs_per_row = shape.half / kPack;
  const int64_t rows = shape.batch * shape.heads * shape.time;
  const int64_t work = rows * packs_per_row;
  const int head_dim = 2 * shape.half;
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < work;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int pack = static_cast<int>(item % packs_per_row);
    const int64_t row = item / packs_per_row;
    int64_t b, h, t;
    if (shape.heads_inner) {
      h = row % shape.heads;
      t = (row / shape.heads) % shape.time;
      b = row / (shape.heads * shape.time);
    } else {
      t = row % shape.time;
      h = (row / shape.time) % shape.heads;
      b = row / (shape.heads * shape.time);
    }
    const int i = pack * kPack;  // first element of the pack in the row's first half
    const T* source = in + b * in_strides.batch + h * in_strides.head + t * in_strides.time + i;
    T* target = out + b * out_strides.batch + h * out_strides.head + t * out_strides.time + i;
    const T* c = cos + t * head_dim + i;
    const T* s = sin + t * head_dim + i;
    const Pack<T, kPack> first = load_pack<T, kPack>(source);
    const Pack<T, kPack> second = load_pack<T, kPack>(source + shape.half);
    const Pack<T, kPack> cos_first = load_pack<T, kPack>(c), cos_second = load_pack<T, kPack>(c + shape.half);
    const Pack<T, kPack> sin_first = load_pack<T, kPack>(s), sin_second = load_pack<T, kPack>(s + shape.half);
    Pack<T, kPack> out_first, out_second;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float x1 = first.get(k), x2 = second.get(k);
      if constexpr (kTranspose) {
        out_first.set(k, __fadd_rn(__fmul_rn(x1, cos_first.get(k)), __fmul_rn(x2, sin_second.get(k))));
        out_second.set(k, __fsub_rn(__fmul_rn(x2, cos_second.get(k)), __fmul_rn(x1, sin_first.get(k))));
      } else {
        out_first.set(k, __fsub_rn(__fmul_rn(x1, cos_first.get(k)), __fmul_rn(x2, sin_first.get(k))));
        out_second.set(k, __fadd_rn(__fmul_rn(x2, cos_second.get(k)), __fmul_rn(x1, sin_second.get(k))));
      }
    }
    store_pack<T, kPack>(target, out_first);
    store_pack<T, kPack>(target + shape.half, out_second);
  }
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

RowStrides row_strides(const Tensor& tensor) { return {tensor.stride(0), tensor.stride(1), tensor.stride(2)}; }

bool pack_fits(const RowStrides& strides, int64_t pack) {
  return strides.batch % pack == 0 && strides.head % pack == 0 && strides.time % pack == 0;
}

template <bool kTranspose>
void launch_rotary(const Tensor& in, const Tensor& cos, const Tensor& sin, const Tensor& out, const char* op) {
  const RotaryShape shape{in.size(0), in.size(1), in.size(2), static_cast<int>(in.size(3) / 2),
                          in.stride(1) < in.stride(2)};
  if (in.numel() == 0) return;
  const int device = in.device().index;
  set_device(device);
  const cudaStream_t stream = current_stream(device);
  dispatch_cuda_floating(in.dtype(), op, [&]<class T>() {
    constexpr int kPack = kPackSize<T>;
    const RowStrides in_strides = row_strides(in), out_strides = row_strides(out);
    const bool packed = shape.half % kPack == 0 && pack_fits(in_strides, kPack) && pack_fits(out_strides, kPack) &&
                        aligned16(in.raw_data()) && aligned16(out.raw_data()) && aligned16(cos.raw_data()) &&
                        aligned16(sin.raw_data());
    const int64_t rows = shape.batch * shape.heads * shape.time;
    if (packed) {
      launch_dependent(rotary_kernel<T, kPack, kTranspose>, grid_for(rows * (shape.half / kPack), kThreads), kThreads,
                       0, stream, in.data<T>(), in_strides, cos.data<T>(), sin.data<T>(), out.data<T>(), out_strides,
                       shape);
    } else {
      launch_dependent(rotary_kernel<T, 1, kTranspose>, grid_for(rows * shape.half, kThreads), kThreads, 0, stream,
                       in.data<T>(), in_strides, cos.data<T>(), sin.data<T>(), out.data<T>(), out_strides, shape);
    }
  });
}

}  // namespace
}  // namespace cuda

void CudaBackend::rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) {
  cuda::launch_rotary</*kTranspose=*/false>(x, cos, sin, out, "rotary_embedding");
}

void CudaBackend::rotary_embedding_backward(const Tensor& grad_out, const Tensor& cos, const Tensor& sin,
                                            const Tensor& grad_x) {
  cuda::launch_rotary</*kTranspose=*/true>(grad_out, cos, sin, grad_x, "rotary_embedding_backward");
}

}  // namespace weft
