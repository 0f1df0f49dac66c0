// CUDA kernels: softmax and log-softmax over the last dim of a contiguous [N, C] tensor, forward and
// backward (CudaBackend::softmax, softmax_backward; the CPU reference is runtime/cpu/softmax.cc).
//
// Forward, C <= 2048 at bf16/f16 and C <= 1024 at f32 or without packs (backward: C <= 1024): one
// warp per row, the row held in registers (every load issued before the first is used), so each
// element is read once and written once; the row maximum and sum are warp shuffles. Longer rows up
// to C = 8192 with 16-byte packs: one block per row, each thread holding 4 packs in registers and the
// block the fewest warps that cover the row (256 threads for C = 8192 bf16, 512 for 8192 f32), so
// the row is again read once; the maximum and sum are block reductions. Otherwise (longer rows, or no
// packs): one block per row; one pass keeps each thread's running (maximum, sum of exp) online, a
// block merge combines them, and a second pass re-reads the row (from L1/L2 at these sizes) and
// writes it. Math is f32; outputs are rounded once. Measured on the H200 at C = 2048 bf16
// (docs/performance.md): a warp with 8 packs per lane, or 64 threads with 4 packs each, 72-77% of
// copy bandwidth; 128 threads with 2 packs each, 51-59%.
//
// Every exponential is exp_shifted (row_kernels.cuh): one MUFU.EX2 of (x - maximum) * log2(e) instead
// of expf's ten or so instructions, because the forward kernels were issue-bound on expf (C = 768 bf16
// forward: 62% -> 75% of copy bandwidth on the H200). Its relative error is about 2^-22. The special
// values are those of expf: exp_shifted(-inf, m) is 0 (padding, masked entries), a row of all -inf
// gives NaN (-inf - -inf) as before, and a NaN stays NaN.
//
// Backward, from the forward output y: softmax: gx = y * (gy - sum(gy * y)); log-softmax:
// gx = gy - exp(y) * sum(gy) (exp of a log-probability: exp_shifted(y, 0)). Same split between the
// warp, the register block and the block kernel. The backward register block keeps its former choice,
// 2 packs of y and 2 of gy a thread (4 each for f32 rows over 4096 columns): already 4 loads in
// flight, as many as the forward's 4 packs; the 4-pack measurement was of the forward only.
#include <cmath>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kWarpRowColumns = 1024;  // the largest C a warp keeps in registers
constexpr int kWarpKernelThreads = 128;  // 4 rows per block
constexpr int kBlockKernelThreads = 512;
constexpr int kRowBlockMaxColumns = 8192;  // the largest C a block keeps in registers
constexpr int kRowBlockMaxThreads = 512;
constexpr int kRowBlockPacks = 4;  // packs each thread of the forward register block holds
// The widest forward row block, C = 8192 f32 (4-element packs), still fits the launch bound.
static_assert(kRowBlockMaxColumns / (kPackSize<float> * kRowBlockPacks) <= kRowBlockMaxThreads);

// Where the threads of a register-path kernel sit. kWarpRows: a warp per row, blockDim.x / 32 rows
// per block (the column stride a compile-time 32, reductions by shuffles). Otherwise the whole block
// per row (stride blockDim.x, a multiple of 32; block reductions through `scratch`, 32 floats).
template <bool kWarpRows>
struct RowThreads {
  int t, threads;       // the thread's index in its row, and the row's thread count
  int64_t first, step;  // the thread's first row and its row stride

  __device__ __forceinline__ RowThreads() {
    if constexpr (kWarpRows) {
      const int64_t rows_per_block = blockDim.x / 32;
      t = static_cast<int>(threadIdx.x) % 32;
      threads = 32;
      first = blockIdx.x * rows_per_block + threadIdx.x / 32;
      step = static_cast<int64_t>(gridDim.x) * rows_per_block;
    } else {
      t = static_cast<int>(threadIdx.x);
      threads = static_cast<int>(blockDim.x);
      first = blockIdx.x;
      step = gridDim.x;
    }
  }
  __device__ __forceinline__ float max(float value, float* scratch) const {
    return kWarpRows ? warp_max(value) : block_max(value, scratch);
  }
  __device__ __forceinline__ float sum(float value, float* scratch) const {
    return kWarpRows ? warp_sum(value) : block_sum(value, scratch);
  }
};

// The block size bound of the register-path kernels: 4 warp rows, or one row of up to 512 threads.
__host__ __device__ constexpr int register_kernel_threads(bool warp_rows) {
  return warp_rows ? kWarpKernelThreads : kRowBlockMaxThreads;
}

// The row held in registers: each of the row's threads holds kPacks packs of kVec elements (columns
// (k * threads + t) * kVec ...), so the row is read once and written once. Pack slots past the row's
// end hold -inf padding, whose exp is 0.
template <class T, int kVec, int kPacks, bool kWarpRows>
__global__ void __launch_bounds__(register_kernel_threads(kWarpRows))
    softmax_registers_kernel(const T* __restrict__ x,  // [rows, columns]
                             T* __restrict__ out,      // [rows, columns]
                             int64_t rows, int columns, bool log) {
  __shared__ float scratch[32];
  const RowThreads<kWarpRows> row_threads;
  const int t = row_threads.t, threads = row_threads.threads;
  for (int64_t row = row_threads.first; row < rows; row += row_threads.step) {
    const T* row_in = x + row * columns;
    T* row_out = out + row * columns;
    // All the row's loads go out before any arithmetic uses one (as in normalization.cu).
    Pack<T, kVec> loaded[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads + t) * kVec;
      if (column < columns) loaded[k] = load_pack_once<T, kVec>(row_in + column);
    }
    float values[kPacks][kVec];
    float maximum = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads + t) * kVec;
      if (column < columns) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          values[k][j] = loaded[k].get(j);
          maximum = fmaxf(maximum, values[k][j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) values[k][j] = -INFINITY;
      }
    }
    maximum = row_threads.max(maximum, scratch);
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        // 0 for the padding (-inf); a row of all -inf gives NaN.
        const float e = exp_shifted(values[k][j], maximum);
        total += e;
        if (!log) values[k][j] = e;
      }
    }
    total = row_threads.sum(total, scratch);
    const float log_total = logf(total), inverse_total = 1.0f / total;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads + t) * kVec;
      if (column < columns) {
        Pack<T, kVec> pack;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          pack.set(j, log ? (values[k][j] - maximum) - log_total : values[k][j] * inverse_total);
        }
        store_pack(row_out + column, pack);
      }
    }
  }
}

// One block per row, for rows too long for a warp's registers.
template <class T, int kVec>
__global__ void __launch_bounds__(kBlockKernelThreads)
    softmax_block_kernel(const T* __restrict__ x,  // [rows, columns]
                         T* __restrict__ out,      // [rows, columns]
                         int64_t rows, int columns, bool log) {
  __shared__ float scratch[64];
  const int packs = columns / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* row_in = x + row * columns;
    T* row_out = out + row * columns;
    MaxSum state{-INFINITY, 0.0f};
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> pack = load_pack<T, kVec>(row_in + p * kVec);
      float pack_maximum = -INFINITY;
#pragma unroll
      for (int j = 0; j < kVec; ++j) pack_maximum = fmaxf(pack_maximum, pack.get(j));
      if (pack_maximum == -INFINITY) continue;  // contributes nothing
      if (pack_maximum > state.maximum) {
        state.sum *= exp_shifted(state.maximum, pack_maximum);  // 0 while the state is empty (-inf)
        state.maximum = pack_maximum;
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) state.sum += exp_shifted(pack.get(j), state.maximum);
    }
    state = block_merge(state, scratch);
    const float maximum = state.maximum, log_total = logf(state.sum), inverse_total = 1.0f / state.sum;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> pack = load_pack<T, kVec>(row_in + p * kVec);
      Pack<T, kVec> result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float value = pack.get(j);
        result.set(j, log ? (value - maximum) - log_total : exp_shifted(value, maximum) * inverse_total);
      }
      store_pack(row_out + p * kVec, result);
    }
  }
}

// Backward counterpart of softmax_registers_kernel: y and grad_y held in registers.
template <class T, int kVec, int kPacks, bool kWarpRows>
__global__ void __launch_bounds__(register_kernel_threads(kWarpRows))
    softmax_backward_registers_kernel(const T* __restrict__ y,       // [rows, columns] forward output
                                      const T* __restrict__ grad_y,  // [rows, columns]
                                      T* __restrict__ grad_x,        // [rows, columns]
                                      int64_t rows, int columns, bool log) {
  __shared__ float scratch[32];
  const RowThreads<kWarpRows> row_threads;
  const int t = row_threads.t, threads = row_threads.threads;
  for (int64_t row = row_threads.first; row < rows; row += row_threads.step) {
    const int64_t base = row * columns;
    Pack<T, kVec> outputs[kPacks], grads[kPacks];
    float reduction = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads + t) * kVec;
      if (column < columns) {
        outputs[k] = load_pack<T, kVec>(y + base + column);
        grads[k] = load_pack<T, kVec>(grad_y + base + column);
#pragma unroll
        for (int j = 0; j < kVec; ++j) reduction += log ? grads[k].get(j) : grads[k].get(j) * outputs[k].get(j);
      }
    }
    reduction = row_threads.sum(reduction, scratch);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads + t) * kVec;
      if (column < columns) {
        Pack<T, kVec> result;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float value = outputs[k].get(j), g = grads[k].get(j);
          result.set(j, log ? g - exp_shifted(value, 0.0f) * reduction : value * (g - reduction));
        }
        store_pack(grad_x + base + column, result);
      }
    }
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kBlockKernelThreads)
    softmax_backward_block_kernel(const T* __restrict__ y,       // [rows, columns] forward output
                                  const T* __restrict__ grad_y,  // [rows, columns]
                                  T* __restrict__ grad_x,        // [rows, columns]
                                  int64_t rows, int columns, bool log) {
  __shared__ float scratch[32];
  const int packs = columns / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * columns;
    float reduction = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> g = load_pack<T, kVec>(grad_y + base + p * kVec);
      if (log) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) reduction += g.get(j);
      } else {
        const Pack<T, kVec> value = load_pack<T, kVec>(y + base + p * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) reduction += g.get(j) * value.get(j);
      }
    }
    reduction = block_sum(reduction, scratch);
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> value = load_pack<T, kVec>(y + base + p * kVec);
      const Pack<T, kVec> g = load_pack<T, kVec>(grad_y + base + p * kVec);
      Pack<T, kVec> result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float output = value.get(j), gradient = g.get(j);
        result.set(j, log ? gradient - exp_shifted(output, 0.0f) * reduction : output * (gradient - reduction));
      }
      store_pack(grad_x + base + p * kVec, result);
    }
  }
}

// Calls body.template operator()<kPacks>() with kPacks = packs_per_lane when that is 3 or 6, else the
// smallest power of two kPacks >= packs_per_lane (packs_per_lane <= kMaxPacks).
template <int kPacks, int kMaxPacks, class Body>
void dispatch_packs_per_lane(int packs_per_lane, Body&& body) {
  // Also exactly 3 and 6 packs (C = 768 at bf16 / f32): no registers and exps spent on padding.
  if constexpr (kPacks == 1 && kMaxPacks >= 4) {
    if (packs_per_lane == 3) return body.template operator()<3>();
  }
  if constexpr (kPacks == 1 && kMaxPacks >= 8) {
    if (packs_per_lane == 6) return body.template operator()<6>();
  }
  if constexpr (kPacks >= kMaxPacks) {
    body.template operator()<kMaxPacks>();
  } else {
    if (packs_per_lane <= kPacks) {
      body.template operator()<kPacks>();
    } else {
      dispatch_packs_per_lane<kPacks * 2, kMaxPacks>(packs_per_lane, body);
    }
  }
}

// [rows, columns] of a tensor whose softmax dim is the last (a 0-d tensor is one row of one column).
struct RowShape {
  int64_t rows = 0;
  int columns = 0;
};

RowShape row_shape(const Tensor& x) {
  const int64_t columns = x.dim() == 0 ? 1 : x.size(-1);
  return {columns == 0 ? 0 : x.numel() / columns, static_cast<int>(columns)};
}

}  // namespace
}  // namespace cuda

void CudaBackend::softmax(const Tensor& x, const Tensor& out, bool log) {
  const cuda::RowShape shape = cuda::row_shape(x);
  if (shape.rows == 0) return;
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "softmax", [&]<class T>() {
    const T* in = x.data<T>();
    T* data = out.data<T>();
    cuda::dispatch_pack<T>(cuda::can_use_packs<T>(shape.columns, in, data), [&]<int kVec>() {
      // A warp per row up to 8 packs per lane (C = 2048 at bf16, 1024 at f32) or 1024 single elements:
      // at C = 2048 bf16 that measured 70% of copy bandwidth, a block of 64 threads with 4 packs each 68%.
      constexpr int kWarpColumns = kVec == 1 ? cuda::kWarpRowColumns : 32 * 8 * kVec;
      if (shape.columns <= kWarpColumns) {
        constexpr int kMaxPacks = kWarpColumns / (32 * kVec);
        const int packs_per_lane = (shape.columns / kVec + 31) / 32;
        cuda::dispatch_packs_per_lane<1, kMaxPacks>(packs_per_lane, [&]<int kPacks>() {
          cuda::softmax_registers_kernel<T, kVec, kPacks, true>
              <<<cuda::grid_for(shape.rows, cuda::kWarpKernelThreads / 32), cuda::kWarpKernelThreads, 0, stream>>>(
                  in, data, shape.rows, shape.columns, log);
        });
      } else if (kVec > 1 && shape.columns <= cuda::kRowBlockMaxColumns) {
        // 4 packs per thread (64 bytes in flight) and the fewest warps that cover the row: 256 threads
        // for C = 8192 bf16, at most 512 (C = 8192 f32). kVec == 1 never comes here (no packs).
        constexpr int kPacks = kVec == 1 ? 1 : cuda::kRowBlockPacks;
        const int packs = shape.columns / kVec;
        const int threads = ((packs + kPacks - 1) / kPacks + 31) / 32 * 32;
        cuda::softmax_registers_kernel<T, kVec, kPacks, false>
            <<<cuda::grid_for(shape.rows, 1), threads, 0, stream>>>(in, data, shape.rows, shape.columns, log);
      } else {
        cuda::softmax_block_kernel<T, kVec>
            <<<cuda::grid_for(shape.rows, 1), cuda::kBlockKernelThreads, 0, stream>>>(in, data, shape.rows,
                                                                                       shape.columns, log);
      }
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& grad_y, const Tensor& grad_x, bool log) {
  const cuda::RowShape shape = cuda::row_shape(y);
  if (shape.rows == 0) return;
  const int device = y.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(y.dtype(), "softmax_backward", [&]<class T>() {
    const T* out = y.data<T>();
    const T* gy = grad_y.data<T>();
    T* gx = grad_x.data<T>();
    cuda::dispatch_pack<T>(cuda::can_use_packs<T>(shape.columns, out, gy, gx), [&]<int kVec>() {
      if (shape.columns <= cuda::kWarpRowColumns) {
        constexpr int kMaxPacks = cuda::kWarpRowColumns / (32 * kVec);
        const int packs_per_lane = (shape.columns / kVec + 31) / 32;
        cuda::dispatch_packs_per_lane<1, kMaxPacks>(packs_per_lane, [&]<int kPacks>() {
          cuda::softmax_backward_registers_kernel<T, kVec, kPacks, true>
              <<<cuda::grid_for(shape.rows, cuda::kWarpKernelThreads / 32), cuda::kWarpKernelThreads, 0, stream>>>(
                  out, gy, gx, shape.rows, shape.columns, log);
        });
      } else if (kVec > 1 && shape.columns <= cuda::kRowBlockMaxColumns) {
        // 2 packs of y and 2 of grad_y per thread (4 loads in flight), 4 of each when the row would
        // need more than 512 threads (f32, C > 4096).
        const int packs = shape.columns / kVec;
        constexpr int kMaxPacks = kVec == 1 ? 1 : cuda::kRowBlockMaxColumns / (cuda::kRowBlockMaxThreads * kVec);
        auto launch = [&]<int kPacks>() {
          const int threads = ((packs + kPacks - 1) / kPacks + 31) / 32 * 32;
          cuda::softmax_backward_registers_kernel<T, kVec, kPacks, false>
              <<<cuda::grid_for(shape.rows, 1), threads, 0, stream>>>(out, gy, gx, shape.rows, shape.columns, log);
        };
        if (kMaxPacks <= 2 || packs <= 2 * cuda::kRowBlockMaxThreads) {
          launch.template operator()<(kMaxPacks < 2 ? kMaxPacks : 2)>();
        } else {
          launch.template operator()<kMaxPacks>();
        }
      } else {
        cuda::softmax_backward_block_kernel<T, kVec>
            <<<cuda::grid_for(shape.rows, 1), cuda::kBlockKernelThreads, 0, stream>>>(out, gy, gx, shape.rows,
                                                                                       shape.columns, log);
      }
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace weft
