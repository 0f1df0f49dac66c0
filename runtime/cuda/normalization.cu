// CUDA kernels: layer norm and RMS norm over the last dim of a contiguous [N, C] tensor, forward and
// backward (CudaBackend::layer_norm, layer_norm_backward, rms_norm, rms_norm_backward; the CPU
// reference, with the formulas, is runtime/cpu/normalization.cc).
//
// Forward: a row is handled by one warp (C up to 768 at bf16/f32) or by several warps of a block
// (larger C), each thread holding its columns in registers as 16-byte packs, so x is read once and
// out written once; mean and variance are two passes over registers (as on the CPU, no
// E[x^2] - E[x]^2 cancellation). mean and rstd are written as f32 [N].
//
// Backward, in two stages so that grad_weight / grad_bias need neither atomics nor a second pass over
// x and grad_out:
//   1. A persistent grid (as many blocks as fit on the GPU at once) walks the rows: per row it
//      reduces mean(g) and mean(g * xhat) (g = grad_out * weight) and writes grad_x, and each thread
//      keeps running sums of grad_out * xhat and grad_out for its own columns in registers. At the
//      end the block adds its rows' sums in a fixed order and writes one partial row:
//      partials [blocks, 2, C] f32 (scratch from the caching allocator).
//   2. A small kernel sums the partial rows per column in a fixed order and writes (=) grad_weight
//      and grad_bias in the weight's dtype.
// Every reduction has a fixed order, so results are the same from run to run. Rows longer than the
// register path holds (forward C > 12288 with packs, backward C > 8192) take a streaming
// block-per-row fallback that re-reads the row.
#include <algorithm>
#include <cmath>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kMaxThreads = 512;        // block size bound of the register-path kernels
constexpr int kMinBlockThreads = 256;   // several rows per block when a row needs fewer threads
// Row elements a thread keeps in registers: the backward also keeps two running sums per element,
// so it holds fewer (more would spill at the 128 registers a 512-thread block allows).
constexpr int forward_values_per_thread(int vec) { return vec == 1 ? 16 : 24; }
constexpr int kBackwardValuesPerThread = 16;
constexpr int kStreamingThreads = 512;  // fallback: one block per row

// How the register-path kernels split a row: threads_per_row threads (a power of two, 32..512) each
// hold packs_per_thread packs; a block holds block_threads / threads_per_row rows.
struct RowSplit {
  int threads_per_row = 32;
  int block_threads = kMinBlockThreads;
  bool fits = true;  // false: the row is too long for registers (streaming fallback)
};

RowSplit split_row(int columns, int vec, int values_per_thread) {
  const int packs = columns / vec;
  const int packs_per_thread = values_per_thread / vec;
  RowSplit split;
  while (split.threads_per_row * packs_per_thread < packs && split.threads_per_row < kMaxThreads) {
    split.threads_per_row *= 2;
  }
  split.fits = split.threads_per_row * packs_per_thread >= packs;
  split.block_threads = std::max(kMinBlockThreads, split.threads_per_row);
  return split;
}

// --- Forward -----------------------------------------------------------------------------------

// kCentered: layer norm (subtract the mean, optional bias); otherwise RMS norm.
template <class T, int kVec, bool kMultiWarp, bool kCentered>
__global__ void __launch_bounds__(kMaxThreads)
    norm_forward_kernel(const T* __restrict__ x,       // [rows, columns]
                        const T* __restrict__ weight,  // [columns]
                        const T* __restrict__ bias,    // [columns] or null
                        T* __restrict__ out,           // [rows, columns]
                        float* __restrict__ mean,      // [rows] (layer norm only)
                        float* __restrict__ rstd,      // [rows]
                        int64_t rows, int columns, int threads_per_row, float eps) {
  constexpr int kPacks = forward_values_per_thread(kVec) / kVec;
  __shared__ float scratch[kMaxThreads / 32];
  const int rows_per_block = static_cast<int>(blockDim.x) / threads_per_row;
  const int group = static_cast<int>(threadIdx.x) / threads_per_row;
  const int t = static_cast<int>(threadIdx.x) % threads_per_row;
  const int warps_per_row = threads_per_row / 32;
  // Every thread of a block runs the same number of rounds (row_sum may synchronize the block).
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    const bool row_valid = row < rows;
    const T* row_in = x + row * columns;
    Pack<T, kVec> v[kPacks];
    float sums[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (row_valid && column < columns) {
        v[k] = load_pack<T, kVec>(row_in + column);
        if constexpr (kCentered) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) sums[0] += v[k].get(j);
        }
      }
    }
    float row_mean = 0.0f;
    if constexpr (kCentered) {
      row_sum<kMultiWarp>(sums, scratch, warps_per_row);
      row_mean = sums[0] / static_cast<float>(columns);
    }
    float squares[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (row_valid && column < columns) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float centered = v[k].get(j) - row_mean;
          squares[0] += centered * centered;
        }
      }
    }
    row_sum<kMultiWarp>(squares, scratch, warps_per_row);
    const float row_rstd = 1.0f / sqrtf(squares[0] / static_cast<float>(columns) + eps);
    if (!row_valid) continue;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (column < columns) {
        // weight and bias are re-read per row from L1: holding them in registers costs occupancy.
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + column);
        Pack<T, kVec> b;
        if (bias != nullptr) b = load_pack<T, kVec>(bias + column);
        Pack<T, kVec> result;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float value = (v[k].get(j) - row_mean) * row_rstd * w.get(j);
          if (bias != nullptr) value += b.get(j);
          result.set(j, value);
        }
        store_pack(out + row * columns + column, result);
      }
    }
    if (t == 0) {
      if constexpr (kCentered) mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

// Fallback for rows too long for registers: one block per row, three passes over the row.
template <class T, int kVec, bool kCentered>
__global__ void __launch_bounds__(kStreamingThreads)
    norm_forward_streaming_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                  T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                  int64_t rows, int columns, float eps) {
  __shared__ float scratch[32];
  const int packs = columns / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* row_in = x + row * columns;
    float row_mean = 0.0f;
    if constexpr (kCentered) {
      float total = 0.0f;
      for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
        const Pack<T, kVec> v = load_pack<T, kVec>(row_in + p * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) total += v.get(j);
      }
      row_mean = block_sum(total, scratch) / static_cast<float>(columns);
    }
    float squares = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> v = load_pack<T, kVec>(row_in + p * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) squares += (v.get(j) - row_mean) * (v.get(j) - row_mean);
    }
    const float row_rstd = 1.0f / sqrtf(block_sum(squares, scratch) / static_cast<float>(columns) + eps);
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> v = load_pack<T, kVec>(row_in + p * kVec);
      const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
      Pack<T, kVec> b;
      if (bias != nullptr) b = load_pack<T, kVec>(bias + p * kVec);
      Pack<T, kVec> result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float value = (v.get(j) - row_mean) * row_rstd * w.get(j);
        if (bias != nullptr) value += b.get(j);
        result.set(j, value);
      }
      store_pack(out + row * columns + p * kVec, result);
    }
    if (threadIdx.x == 0) {
      if constexpr (kCentered) mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

// --- Backward ----------------------------------------------------------------------------------

// Stage 1. grad_x per row; per-block partial sums of grad_out * xhat (partials[block][0]) and, for
// layer norm with a bias, grad_out (partials[block][1]). Dynamic shared memory: 2 * columns floats
// when a block holds several rows (to add the rows' sums in order), else none.
template <class T, int kVec, bool kMultiWarp, bool kCentered>
__global__ void __launch_bounds__(kMaxThreads)
    norm_backward_kernel(const T* __restrict__ x,           // [rows, columns]
                         const T* __restrict__ weight,      // [columns]
                         const float* __restrict__ mean,    // [rows] (layer norm only)
                         const float* __restrict__ rstd,    // [rows]
                         const T* __restrict__ grad_out,    // [rows, columns]
                         T* __restrict__ grad_x,            // [rows, columns]
                         float* __restrict__ partials,      // [gridDim.x, 2, columns]
                         int64_t rows, int columns, int threads_per_row, bool with_bias) {
  constexpr int kPacks = kBackwardValuesPerThread / kVec;
  __shared__ float scratch[2 * kMaxThreads / 32];
  extern __shared__ float merged[];  // [2, columns]
  const int rows_per_block = static_cast<int>(blockDim.x) / threads_per_row;
  const int group = static_cast<int>(threadIdx.x) / threads_per_row;
  const int t = static_cast<int>(threadIdx.x) % threads_per_row;
  const int warps_per_row = threads_per_row / 32;
  const float inverse_columns = 1.0f / static_cast<float>(columns);
  float weight_sums[kPacks][kVec], bias_sums[kPacks][kVec];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) weight_sums[k][j] = bias_sums[k][j] = 0.0f;
  }
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    const bool row_valid = row < rows;
    const int64_t offset = row * columns;
    const float row_mean = kCentered && row_valid ? mean[row] : 0.0f;
    const float row_rstd = row_valid ? rstd[row] : 0.0f;
    Pack<T, kVec> xs[kPacks], gys[kPacks];
    float sums[2] = {0.0f, 0.0f};  // sum(g), sum(g * xhat)
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (row_valid && column < columns) {
        xs[k] = load_pack<T, kVec>(x + offset + column);
        gys[k] = load_pack<T, kVec>(grad_out + offset + column);
        // weight is re-read per row from L1: holding it in registers costs occupancy.
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + column);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xhat = (xs[k].get(j) - row_mean) * row_rstd;
          const float gy = gys[k].get(j);
          const float g = gy * w.get(j);
          sums[0] += g;
          sums[1] += g * xhat;
          weight_sums[k][j] += gy * xhat;
          bias_sums[k][j] += gy;
        }
      }
    }
    row_sum<kMultiWarp>(sums, scratch, warps_per_row);
    if (!row_valid) continue;
    const float mean_g = kCentered ? sums[0] * inverse_columns : 0.0f;
    const float mean_g_xhat = sums[1] * inverse_columns;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (column < columns) {
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + column);
        Pack<T, kVec> result;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xhat = (xs[k].get(j) - row_mean) * row_rstd;
          const float g = gys[k].get(j) * w.get(j);
          result.set(j, row_rstd * (g - mean_g - xhat * mean_g_xhat));
        }
        store_pack(grad_x + offset + column, result);
      }
    }
  }
  // This block's partial row: the rows' sums added in group order.
  float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * 2 * columns;
  const bool bias_sums_needed = kCentered && with_bias;
  if (rows_per_block == 1) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (column < columns) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          block_partials[column + j] = weight_sums[k][j];
          if (bias_sums_needed) block_partials[columns + column + j] = bias_sums[k][j];
        }
      }
    }
    return;
  }
  for (int g = 0; g < rows_per_block; ++g) {
    if (group == g) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * threads_per_row + t) * kVec;
        if (column < columns) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            merged[column + j] = (g == 0 ? 0.0f : merged[column + j]) + weight_sums[k][j];
            if (bias_sums_needed) merged[columns + column + j] = (g == 0 ? 0.0f : merged[columns + column + j]) + bias_sums[k][j];
          }
        }
      }
    }
    __syncthreads();
  }
  const int count = bias_sums_needed ? 2 * columns : columns;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) block_partials[i] = merged[i];
}

// Fallback stage 1 for rows too long for registers: one block per row, two passes over the row; each
// thread adds its columns' sums straight into its block's partial row (columns are the thread's
// own, so no other thread touches them).
template <class T, int kVec, bool kCentered>
__global__ void __launch_bounds__(kStreamingThreads)
    norm_backward_streaming_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   const T* __restrict__ grad_out, T* __restrict__ grad_x,
                                   float* __restrict__ partials, int64_t rows, int columns, bool with_bias) {
  __shared__ float scratch[32];
  const int packs = columns / kVec;
  const float inverse_columns = 1.0f / static_cast<float>(columns);
  float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * 2 * columns;
  const bool bias_sums_needed = kCentered && with_bias;
  for (int i = static_cast<int>(threadIdx.x) * kVec; i < columns; i += blockDim.x * kVec) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      block_partials[i + j] = 0.0f;
      if (bias_sums_needed) block_partials[columns + i + j] = 0.0f;
    }
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * columns;
    const float row_mean = kCentered ? mean[row] : 0.0f, row_rstd = rstd[row];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> xv = load_pack<T, kVec>(x + offset + p * kVec);
      const Pack<T, kVec> gy = load_pack<T, kVec>(grad_out + offset + p * kVec);
      const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xhat = (xv.get(j) - row_mean) * row_rstd;
        const float g = gy.get(j) * w.get(j);
        sum_g += g;
        sum_g_xhat += g * xhat;
      }
    }
    const float mean_g = kCentered ? block_sum(sum_g, scratch) * inverse_columns : 0.0f;
    const float mean_g_xhat = block_sum(sum_g_xhat, scratch) * inverse_columns;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> xv = load_pack<T, kVec>(x + offset + p * kVec);
      const Pack<T, kVec> gy = load_pack<T, kVec>(grad_out + offset + p * kVec);
      const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
      Pack<T, kVec> result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xhat = (xv.get(j) - row_mean) * row_rstd;
        const float g = gy.get(j) * w.get(j);
        result.set(j, row_rstd * (g - mean_g - xhat * mean_g_xhat));
        block_partials[p * kVec + j] += gy.get(j) * xhat;
        if (bias_sums_needed) block_partials[columns + p * kVec + j] += gy.get(j);
      }
      store_pack(grad_x + offset + p * kVec, result);
    }
  }
}

// Stage 2: grad_weight[c] = sum over blocks of partials[b][0][c] (and grad_bias from [b][1][c]).
// A block covers 32 columns with 32 lanes of block indices each; the 32 slices are added in order.
constexpr int kSumColumns = 32, kSumSlices = 32;

template <class T>
__global__ void __launch_bounds__(kSumColumns * kSumSlices)
    sum_partials_kernel(const float* __restrict__ partials,  // [blocks, 2, columns]
                        int blocks, int columns,
                        T* __restrict__ grad_weight,  // [columns]
                        T* __restrict__ grad_bias) {  // [columns] or null
  __shared__ float slices[kSumSlices][kSumColumns + 1];
  const int sums = grad_bias != nullptr ? 2 : 1;
  const int lane = static_cast<int>(threadIdx.x) % kSumColumns, slice = static_cast<int>(threadIdx.x) / kSumColumns;
  // Flat index over [sums, columns]: which sum, then the column.
  const int index = static_cast<int>(blockIdx.x) * kSumColumns + lane;
  const bool valid = index < sums * columns;
  float total = 0.0f;
  if (valid) {
    for (int b = slice; b < blocks; b += kSumSlices) total += partials[static_cast<int64_t>(b) * 2 * columns + index];
  }
  slices[slice][lane] = total;
  __syncthreads();
  if (slice == 0 && valid) {
    float sum = 0.0f;
    for (int s = 0; s < kSumSlices; ++s) sum += slices[s][lane];
    if (index < columns) {
      grad_weight[index] = from_float<T>(sum);
    } else {
      grad_bias[index - columns] = from_float<T>(sum);
    }
  }
}

// --- Launchers ---------------------------------------------------------------------------------

template <class T, bool kCentered>
void launch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                         const Tensor& mean, const Tensor& rstd, cudaStream_t stream) {
  const int columns = static_cast<int>(x.size(-1));
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  if (rows == 0) return;
  const T* in = x.data<T>();
  const T* w = weight.data<T>();
  const T* b = bias.defined() ? bias.data<T>() : nullptr;
  T* data = out.data<T>();
  float* mean_data = kCentered ? mean.data<float>() : nullptr;
  float* rstd_data = rstd.data<float>();
  const bool packed = can_use_packs<T>(columns, in, w, data) && (b == nullptr || is_aligned_16(b));
  dispatch_pack<T>(packed, [&]<int kVec>() {
    const RowSplit split = split_row(columns, kVec, forward_values_per_thread(kVec));
    if (!split.fits) {
      norm_forward_streaming_kernel<T, kVec, kCentered><<<grid_for(rows, 1), kStreamingThreads, 0, stream>>>(
          in, w, b, data, mean_data, rstd_data, rows, columns, static_cast<float>(eps));
    } else {
      const int rows_per_block = split.block_threads / split.threads_per_row;
      auto launch = [&]<bool kMultiWarp>() {
        norm_forward_kernel<T, kVec, kMultiWarp, kCentered>
            <<<grid_for(rows, rows_per_block), split.block_threads, 0, stream>>>(
                in, w, b, data, mean_data, rstd_data, rows, columns, split.threads_per_row, static_cast<float>(eps));
      };
      if (split.threads_per_row == 32) {
        launch.template operator()<false>();
      } else {
        launch.template operator()<true>();
      }
    }
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

template <class T, bool kCentered>
void launch_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                          const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                          const Tensor& grad_bias, cudaStream_t stream) {
  const int columns = static_cast<int>(x.size(-1));
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  const int device = x.device().index;
  const bool with_bias = kCentered && grad_bias.defined();
  T* gw = grad_weight.data<T>();
  T* gb = with_bias ? grad_bias.data<T>() : nullptr;
  if (columns == 0) return;
  if (rows == 0) {
    // Sums over no rows: grad_weight and grad_bias are zero.
    WEFT_CUDA_CHECK(cudaMemsetAsync(gw, 0, sizeof(T) * columns, stream));
    if (gb != nullptr) WEFT_CUDA_CHECK(cudaMemsetAsync(gb, 0, sizeof(T) * columns, stream));
    return;
  }
  const T* in = x.data<T>();
  const T* w = weight.data<T>();
  const T* gy = grad_out.data<T>();
  T* gx = grad_x.data<T>();
  const float* mean_data = kCentered ? mean.data<float>() : nullptr;
  const float* rstd_data = rstd.data<float>();
  const bool packed = can_use_packs<T>(columns, in, w, gy, gx);
  int blocks = 0;
  Tensor partials;
  dispatch_pack<T>(packed, [&]<int kVec>() {
    const RowSplit split = split_row(columns, kVec, kBackwardValuesPerThread);
    if (!split.fits) {
      blocks = static_cast<int>(std::min<int64_t>(rows, 2 * multiprocessor_count(device)));
      partials = Tensor::empty({blocks, 2, columns}, kFloat32, x.device());
      norm_backward_streaming_kernel<T, kVec, kCentered><<<blocks, kStreamingThreads, 0, stream>>>(
          in, w, mean_data, rstd_data, gy, gx, partials.data<float>(), rows, columns, with_bias);
      WEFT_CUDA_CHECK_LAUNCH();
      return;
    }
    const int rows_per_block = split.block_threads / split.threads_per_row;
    const size_t shared_bytes = rows_per_block > 1 ? sizeof(float) * 2 * columns : 0;
    auto launch = [&]<bool kMultiWarp>() {
      const auto kernel = norm_backward_kernel<T, kVec, kMultiWarp, kCentered>;
      if (shared_bytes > 48 * 1024) {
        WEFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(shared_bytes)));
      }
      // A persistent grid: as many blocks as are resident at once, so that there are few partial rows.
      int per_multiprocessor = 0;
      WEFT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, split.block_threads,
                                                                    shared_bytes));
      const int64_t needed = (rows + rows_per_block - 1) / rows_per_block;
      blocks = static_cast<int>(
          std::min<int64_t>(needed, static_cast<int64_t>(std::max(per_multiprocessor, 1)) * multiprocessor_count(device)));
      partials = Tensor::empty({blocks, 2, columns}, kFloat32, x.device());
      kernel<<<blocks, split.block_threads, shared_bytes, stream>>>(in, w, mean_data, rstd_data, gy, gx,
                                                                   partials.data<float>(), rows, columns,
                                                                   split.threads_per_row, with_bias);
      WEFT_CUDA_CHECK_LAUNCH();
    };
    if (split.threads_per_row == 32) {
      launch.template operator()<false>();
    } else {
      launch.template operator()<true>();
    }
  });
  const int sums = with_bias ? 2 : 1;
  sum_partials_kernel<T><<<(sums * columns + kSumColumns - 1) / kSumColumns, kSumColumns * kSumSlices, 0, stream>>>(
      partials.data<float>(), blocks, columns, gw, gb);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace cuda

void CudaBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                             const Tensor& mean, const Tensor& rstd) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "layer_norm", [&]<class T>() {
    cuda::launch_norm_forward<T, true>(x, weight, bias, eps, out, mean, rstd, stream);
  });
}

void CudaBackend::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                                      const Tensor& grad_bias) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    cuda::launch_norm_backward<T, true>(x, weight, mean, rstd, grad_out, grad_x, grad_weight, grad_bias, stream);
  });
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out, const Tensor& rstd) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "rms_norm", [&]<class T>() {
    cuda::launch_norm_forward<T, false>(x, weight, Tensor(), eps, out, Tensor(), rstd, stream);
  });
}

void CudaBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& grad_out,
                                    const Tensor& grad_x, const Tensor& grad_weight) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "rms_norm_backward", [&]<class T>() {
    cuda::launch_norm_backward<T, false>(x, weight, Tensor(), rstd, grad_out, grad_x, grad_weight, Tensor(), stream);
  });
}

}  // namespace weft
