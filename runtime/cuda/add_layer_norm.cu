// CUDA kernel: fused residual add + layer norm over the last dim of contiguous [N, C] tensors
// (CudaBackend::add_layer_norm; the CPU reference is Backend::add_layer_norm's default: binary add,
// then layer_norm, runtime/cpu/normalization.cc).
//
// One pass: each thread reads its columns of x and residual once as 16-byte packs (streaming loads:
// they are not read again), adds them in f32, rounds the sum to the stored dtype (the sum written to
// sum_out is the tensor whose statistics are taken, as in the unfused add then layer_norm), keeps
// the rounded sum in registers, and writes sum_out and out. Mean and variance are two passes over
// registers (no E[x^2] - E[x]^2 cancellation), f32, written to mean and rstd [N] as layer_norm does,
// so the layer_norm backward kernel runs unchanged on (sum, mean, rstd).
//
// A row is handled by one warp (C up to 768 at bf16/f32 with packs) or by several warps of a block;
// rows too long for registers (C > 12288 with packs, C > 8192 without) take a block-per-row fallback
// that re-reads the sum it wrote. Odd C or misaligned views run the same kernels with packs of one
// element. Every reduction has a fixed order, so results are the same from run to run.
//
// The helpers here are private to this file (the shared row_kernels.cuh is not used, so this kernel
// does not depend on its changes).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kMaxThreads = 512;       // block size bound of the register-path kernel
constexpr int kMinBlockThreads = 256;  // several rows per block when a row needs fewer threads
constexpr int kStreamingThreads = 512;  // fallback: one block per row
// Row elements a thread keeps in registers (as layer_norm's forward).
constexpr int values_per_thread(int vec) { return vec == 1 ? 16 : 24; }

// kCount consecutive elements loaded or stored together (16 bytes when kCount * sizeof(T) == 16).
template <class T, int kCount>
struct alignas(sizeof(T) * kCount) RowPack {
  T values[kCount];
  __device__ __forceinline__ float get(int i) const { return to_float(values[i]); }
  __device__ __forceinline__ void set(int i, float value) { values[i] = from_float<T>(value); }
};

template <class T, int kCount>
__device__ __forceinline__ RowPack<T, kCount> load_once(const T* address) {
  RowPack<T, kCount> pack;
  if constexpr (sizeof(pack) == 16) {
    const int4 bits = __ldcs(reinterpret_cast<const int4*>(address));
    memcpy(&pack, &bits, 16);
  } else {
    pack = *reinterpret_cast<const RowPack<T, kCount>*>(address);
  }
  return pack;
}

template <class T, int kCount>
__device__ __forceinline__ RowPack<T, kCount> load(const T* address) {
  RowPack<T, kCount> pack;
  if constexpr (sizeof(pack) == 16) {
    const int4 bits = *reinterpret_cast<const int4*>(address);
    memcpy(&pack, &bits, 16);
  } else {
    pack = *reinterpret_cast<const RowPack<T, kCount>*>(address);
  }
  return pack;
}

template <class T, int kCount>
__device__ __forceinline__ void store(T* address, const RowPack<T, kCount>& pack) {
  if constexpr (sizeof(pack) == 16) {
    int4 bits;
    memcpy(&bits, &pack, 16);
    *reinterpret_cast<int4*>(address) = bits;
  } else {
    *reinterpret_cast<RowPack<T, kCount>*>(address) = pack;
  }
}

__device__ __forceinline__ float warp_total(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// The sum of `value` over the threads of one row: one warp (kMultiWarp false), or warps_per_row
// consecutive warps of the block (every thread of the block must call: it synchronizes the block).
// `scratch` holds blockDim.x / 32 floats; warps are added in order.
template <bool kMultiWarp>
__device__ __forceinline__ float row_total(float value, float* scratch, int warps_per_row) {
  value = warp_total(value);
  if constexpr (kMultiWarp) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int first_warp = warp / warps_per_row * warps_per_row;
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = 0.0f;
    for (int w = 0; w < warps_per_row; ++w) value += scratch[first_warp + w];
    __syncthreads();  // scratch is reused by the next call
  }
  return value;
}

// The sum over the whole block (all threads call; all get the result). scratch: 32 floats.
__device__ __forceinline__ float block_total(float value, float* scratch) {
  value = warp_total(value);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = 0.0f;
  for (int w = 0; w < warps; ++w) value += scratch[w];
  __syncthreads();
  return value;
}

template <class T, int kVec, bool kMultiWarp>
__global__ void __launch_bounds__(kMaxThreads)
    add_layer_norm_kernel(const T* __restrict__ x,         // [rows, columns]
                          const T* __restrict__ residual,  // [rows, columns]
                          const T* __restrict__ weight,    // [columns]
                          const T* __restrict__ bias,      // [columns] or null
                          T* __restrict__ sum_out,         // [rows, columns]
                          T* __restrict__ out,             // [rows, columns]
                          float* __restrict__ mean,        // [rows]
                          float* __restrict__ rstd,        // [rows]
                          int64_t rows, int columns, int threads_per_row, float eps) {
  constexpr int kPacks = values_per_thread(kVec) / kVec;
  __shared__ float scratch[kMaxThreads / 32];
  const int rows_per_block = static_cast<int>(blockDim.x) / threads_per_row;
  const int group = static_cast<int>(threadIdx.x) / threads_per_row;
  const int t = static_cast<int>(threadIdx.x) % threads_per_row;
  const int warps_per_row = threads_per_row / 32;
  // Every thread of a block runs the same number of rounds (row_total may synchronize the block).
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    const bool row_valid = row < rows;
    const int64_t offset = row * columns;
    RowPack<T, kVec> v[kPacks];
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (row_valid && column < columns) {
        const RowPack<T, kVec> a = load_once<T, kVec>(x + offset + column);
        const RowPack<T, kVec> b = load_once<T, kVec>(residual + offset + column);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          v[k].set(j, a.get(j) + b.get(j));  // rounded to T, as the unfused add stores it
          total += v[k].get(j);
        }
        store(sum_out + offset + column, v[k]);
      }
    }
    const float row_mean = row_total<kMultiWarp>(total, scratch, warps_per_row) / static_cast<float>(columns);
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (row_valid && column < columns) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float centered = v[k].get(j) - row_mean;
          squares += centered * centered;
        }
      }
    }
    const float variance = row_total<kMultiWarp>(squares, scratch, warps_per_row) / static_cast<float>(columns);
    const float row_rstd = 1.0f / sqrtf(variance + eps);
    if (!row_valid) continue;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (column < columns) {
        const RowPack<T, kVec> w = load<T, kVec>(weight + column);
        RowPack<T, kVec> b;
        if (bias != nullptr) b = load<T, kVec>(bias + column);
        RowPack<T, kVec> result;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float value = (v[k].get(j) - row_mean) * row_rstd * w.get(j);
          if (bias != nullptr) value += b.get(j);
          result.set(j, value);
        }
        store(out + offset + column, result);
      }
    }
    if (t == 0) {
      mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

// Fallback for rows too long for registers: one block per row; the sum is written in the first pass
// and re-read (each thread reads back only the packs it wrote) in the other two.
template <class T, int kVec>
__global__ void __launch_bounds__(kStreamingThreads)
    add_layer_norm_streaming_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                                    const T* __restrict__ weight, const T* __restrict__ bias, T* sum_out,
                                    T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                    int64_t rows, int columns, float eps) {
  __shared__ float scratch[32];
  const int packs = columns / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * columns;
    float total = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const RowPack<T, kVec> a = load_once<T, kVec>(x + offset + p * kVec);
      const RowPack<T, kVec> b = load_once<T, kVec>(residual + offset + p * kVec);
      RowPack<T, kVec> s;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        s.set(j, a.get(j) + b.get(j));
        total += s.get(j);
      }
      store(sum_out + offset + p * kVec, s);
    }
    const float row_mean = block_total(total, scratch) / static_cast<float>(columns);
    float squares = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const RowPack<T, kVec> s = load<T, kVec>(sum_out + offset + p * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) squares += (s.get(j) - row_mean) * (s.get(j) - row_mean);
    }
    const float row_rstd = 1.0f / sqrtf(block_total(squares, scratch) / static_cast<float>(columns) + eps);
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const RowPack<T, kVec> s = load<T, kVec>(sum_out + offset + p * kVec);
      const RowPack<T, kVec> w = load<T, kVec>(weight + p * kVec);
      RowPack<T, kVec> b;
      if (bias != nullptr) b = load<T, kVec>(bias + p * kVec);
      RowPack<T, kVec> result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float value = (s.get(j) - row_mean) * row_rstd * w.get(j);
        if (bias != nullptr) value += b.get(j);
        result.set(j, value);
      }
      store(out + offset + p * kVec, result);
    }
    if (threadIdx.x == 0) {
      mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

template <class T>
void launch_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           double eps, const Tensor& sum_out, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, cudaStream_t stream) {
  const int columns = static_cast<int>(x.size(-1));
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  if (rows == 0) return;
  const T* in = x.data<T>();
  const T* res = residual.data<T>();
  const T* w = weight.data<T>();
  const T* b = bias.defined() ? bias.data<T>() : nullptr;
  T* sum_data = sum_out.data<T>();
  T* out_data = out.data<T>();
  float* mean_data = mean.data<float>();
  float* rstd_data = rstd.data<float>();
  constexpr int kPackVec = static_cast<int>(16 / sizeof(T));
  const bool packed = columns % kPackVec == 0 && aligned_16(in) && aligned_16(res) && aligned_16(w) &&
                      (b == nullptr || aligned_16(b)) && aligned_16(sum_data) && aligned_16(out_data);
  auto run = [&]<int kVec>() {
    const int packs = columns / kVec;
    const int packs_per_thread = values_per_thread(kVec) / kVec;
    int threads_per_row = 32;
    while (threads_per_row * packs_per_thread < packs && threads_per_row < kMaxThreads) threads_per_row *= 2;
    if (threads_per_row * packs_per_thread < packs) {
      add_layer_norm_streaming_kernel<T, kVec><<<grid_for(rows, 1), kStreamingThreads, 0, stream>>>(
          in, res, w, b, sum_data, out_data, mean_data, rstd_data, rows, columns, static_cast<float>(eps));
    } else {
      const int block_threads = std::max(kMinBlockThreads, threads_per_row);
      const int rows_per_block = block_threads / threads_per_row;
      auto launch = [&]<bool kMultiWarp>() {
        add_layer_norm_kernel<T, kVec, kMultiWarp><<<grid_for(rows, rows_per_block), block_threads, 0, stream>>>(
            in, res, w, b, sum_data, out_data, mean_data, rstd_data, rows, columns, threads_per_row,
            static_cast<float>(eps));
      };
      if (threads_per_row == 32) {
        launch.template operator()<false>();
      } else {
        launch.template operator()<true>();
      }
    }
    WEFT_CUDA_CHECK_LAUNCH();
  };
  if (packed) {
    run.template operator()<kPackVec>();
  } else {
    run.template operator()<1>();
  }
}

}  // namespace
}  // namespace cuda

void CudaBackend::add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                 double eps, const Tensor& sum_out, const Tensor& out, const Tensor& mean,
                                 const Tensor& rstd) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "add_layer_norm", [&]<class T>() {
    cuda::launch_add_layer_norm<T>(x, residual, weight, bias, eps, sum_out, out, mean, rstd, stream);
  });
}

}  // namespace weft
