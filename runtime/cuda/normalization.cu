// CUDA kernels: layer norm and RMS norm over the last dim of a contiguous [N, C] tensor, forward and
// backward, and the residual add fused with the layer norm forward (CudaBackend::layer_norm,
// layer_norm_backward, rms_norm, rms_norm_backward, add_layer_norm; the CPU reference, with the
// formulas, is runtime/cpu/normalization.cc).
//
// Forward: a row is handled by one warp when it fits in at most 4 packs (16 bytes each) per lane
// (C <= 1024 at bf16, 512 at f32), else by several warps (which reduce through shared memory and a
// named barrier of their own, so the other rows of the block do not wait); each thread holds its
// columns in registers, so x is read once (ld.global.nc with an L2 256-byte prefetch) and out
// written once.
// Mean and variance are two passes over registers (as on the CPU, no E[x^2] - E[x]^2
// cancellation); mean and rstd are written as f32 [N]. The packs per thread are the fewest that cover
// the row, up to 4, and every load of a row is issued before the arithmetic starts (measurements:
// forward_packs below). With a residual (add_layer_norm), each thread adds x and residual in f32,
// rounds the sum to the stored dtype (the unfused add stores it so) and writes it to sum_out; the
// statistics are taken over the rounded sum.
//
// Backward, in two stages so that grad_weight / grad_bias need neither atomics nor a second pass over
// x and grad_out:
//   1. A persistent grid walks the rows, one row per group of threads (a warp for C <= 768 at bf16,
//      else a power-of-two number of warps; groups reduce through shuffles and, across warps, through
//      shared memory and a named barrier of that group alone). Each thread copies its own packs of x
//      and grad_out, and the row's mean and rstd, for the next row into its own shared-memory slots
//      with cp.async while it computes the current row, and reads back only what it copied itself
//      (no barrier for the data). Per row it reduces mean(g) and mean(g * xhat) (g = grad_out *
//      weight), writes grad_x, and keeps running sums of grad_out * xhat and grad_out for its own
//      columns in registers. At the end the block adds its groups' sums in a fixed order and writes
//      one partial row: partials [blocks, 2, C] f32 (scratch from the caching allocator).
//   2. A small kernel sums the partial rows per column in a fixed order and writes (=) grad_weight
//      and grad_bias in the weight's dtype.
// Every reduction has a fixed order, so results are the same from run to run. Rows that do not move
// in 16-byte packs (odd C, misaligned views) take a register kernel without the copy pipeline; rows
// longer than the register paths hold (forward C > 16384 at bf16, backward C > 8192) take a
// streaming block-per-row fallback that re-reads the row.
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
constexpr int kStreamingThreads = 512;  // fallback: one block per row

// --- Row splits ----------------------------------------------------------------------------------

// How a register-path kernel splits a row: threads_per_row threads (a power of two, 32..512) each
// hold `packs_per_thread` packs; a block holds block_threads / threads_per_row rows.
struct RowSplit {
  int threads_per_row = 32;
  int block_threads = kMinBlockThreads;
  bool fits = true;  // false: the row is too long for registers (streaming fallback)
};

RowSplit split_row(int packs, int packs_per_thread) {
  RowSplit split;
  while (split.threads_per_row * packs_per_thread < packs && split.threads_per_row < kMaxThreads) {
    split.threads_per_row *= 2;
  }
  split.fits = split.threads_per_row * packs_per_thread >= packs;
  split.block_threads = std::max(kMinBlockThreads, split.threads_per_row);
  return split;
}

// The most packs a forward thread holds: 4 packs of 16 bytes, or 16 single elements when the row
// does not move in packs. Measured on the H200 at C = 2048 bf16 (docs/performance.md): on a warp per
// row with 8 packs per lane layer_norm ran at 63% of copy bandwidth and add_layer_norm (8 packs of x
// and 8 of the residual) at 59%; on two warps with 4 packs each, at 68-69% and 76-80%.
constexpr int forward_packs(int vec) { return vec == 1 ? 16 : 4; }

// Packs per lane of the forward's warp-per-row path: the fewest of 1..forward_packs that cover the
// row. Calls body.template operator()<kPacks>(); false when the row needs more (several warps).
template <class Body>
bool dispatch_warp_packs(int packs, Body&& body) {
  static_assert(forward_packs(8) == 4, "the cases below cover 1..4 packs per lane");
  const int per_lane = (packs + 31) / 32;
  if (per_lane <= 1) { body.template operator()<1>(); return true; }
  if (per_lane <= 2) { body.template operator()<2>(); return true; }
  if (per_lane <= 3) { body.template operator()<3>(); return true; }
  if (per_lane <= 4) { body.template operator()<4>(); return true; }
  return false;
}

// --- Forward -----------------------------------------------------------------------------------

// Sums kCount values over a group of threads_per_row threads (consecutive warps of the block, one
// row): shuffles, then, for several warps, shared memory and the group's own named barrier (id
// 1 + group), so that the other rows of the block do not wait. `scratch` holds
// 2 * kCount * blockDim.x / 32 floats; its two halves alternate between calls (`parity`), so one
// barrier per call suffices: a warp can only rewrite a half after every warp of its group has passed
// the barrier of the call in between, that is, finished reading it. Warps are added in order.
template <int kCount>
__device__ __forceinline__ void group_sum(float (&values)[kCount], float* scratch, int& parity, int group, int t,
                                          int threads_per_row) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) values[i] = warp_sum(values[i]);
  const int warps_per_group = threads_per_row / 32;
  if (warps_per_group == 1) return;
  const int groups = static_cast<int>(blockDim.x) / threads_per_row;
  float* half = scratch + ((parity * groups + group) * warps_per_group) * kCount;
  if (t % 32 == 0) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) half[(t / 32) * kCount + i] = values[i];
  }
  asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "r"(threads_per_row) : "memory");
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    float total = 0.0f;
    for (int w = 0; w < warps_per_group; ++w) total += half[w * kCount + i];
    values[i] = total;
  }
  parity ^= 1;
}


// kCentered: layer norm (subtract the mean, optional bias); otherwise RMS norm. kResidual (layer norm
// only): the normalized row is x + residual, rounded to T and written to sum_out.
// Blocks of kBlockThreads (256 or 512). The launch bound asks for half the SM's threads resident
// (64 registers a thread; 85 with a residual, which holds twice the loads, and 128 for rows without
// packs, which hold 16 single elements): left to itself the compiler took 82-95 registers on the
// two-warp rows of C = 2048, two blocks per SM, and the kernel ran at 53% of copy bandwidth (68% at
// 62 registers, H200).
constexpr int forward_min_blocks(int vec, bool residual, int block_threads) {
  return (vec == 1 ? 512 : residual ? 768 : 1024) / block_threads;
}

template <class T, int kVec, int kPacks, bool kMultiWarp, bool kCentered, bool kResidual, int kBlockThreads>
__global__ void __launch_bounds__(kBlockThreads, forward_min_blocks(kVec, kResidual, kBlockThreads))
    norm_forward_kernel(const T* __restrict__ x,         // [rows, columns]
                        const T* __restrict__ residual,  // [rows, columns] (kResidual only)
                        const T* __restrict__ weight,    // [columns]
                        const T* __restrict__ bias,      // [columns] or null
                        T* __restrict__ sum_out,         // [rows, columns] (kResidual only)
                        T* __restrict__ out,             // [rows, columns]
                        float* __restrict__ mean,        // [rows] (layer norm only)
                        float* __restrict__ rstd,        // [rows]
                        int64_t rows, int columns, int threads_per_row, float eps) {
  __shared__ float scratch[2 * kBlockThreads / 32];
  // A warp per row: the column stride is a compile-time 32 (cheaper indexing, and no barrier).
  if constexpr (!kMultiWarp) threads_per_row = 32;
  const int rows_per_block = static_cast<int>(blockDim.x) / threads_per_row;
  const int group = static_cast<int>(threadIdx.x) / threads_per_row;
  const int t = static_cast<int>(threadIdx.x) % threads_per_row;
  int parity = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rows_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    const bool row_valid = row < rows;
    const int64_t offset = row * columns;
    // Every load of the row is issued before any arithmetic uses one (a loop that loads and adds
    // pack by pack measured 15-25% slower on the H200: the loads went out one after another).
    Pack<T, kVec> v[kPacks];
    if constexpr (kResidual) {
      Pack<T, kVec> addend[kPacks];
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * threads_per_row + t) * kVec;
        if (row_valid && column < columns) {
          v[k] = load_pack_once<T, kVec>(x + offset + column);
          addend[k] = load_pack_once<T, kVec>(residual + offset + column);
        }
      }
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * threads_per_row + t) * kVec;
        if (row_valid && column < columns) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) v[k].set(j, v[k].get(j) + addend[k].get(j));  // rounded to T
          store_pack(sum_out + offset + column, v[k]);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * threads_per_row + t) * kVec;
        if (row_valid && column < columns) v[k] = load_pack_once<T, kVec>(x + offset + column);
      }
    }
    float sums[1] = {0.0f};
    if constexpr (kCentered) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * threads_per_row + t) * kVec;
        if (row_valid && column < columns) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) sums[0] += v[k].get(j);
        }
      }
    }
    float row_mean = 0.0f;
    if constexpr (kCentered) {
      group_sum(sums, scratch, parity, group, t, threads_per_row);
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
    group_sum(squares, scratch, parity, group, t, threads_per_row);
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
        store_pack(out + offset + column, result);
      }
    }
    if (t == 0) {
      if constexpr (kCentered) mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

// Fallback for rows too long for registers: one block per row, three passes over the row (the sum
// x + residual is written in the first and read back, by the thread that wrote it, in the others).
template <class T, int kVec, bool kCentered, bool kResidual>
__global__ void __launch_bounds__(kStreamingThreads)
    norm_forward_streaming_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                                  const T* __restrict__ weight, const T* __restrict__ bias, T* sum_out,
                                  T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                  int64_t rows, int columns, float eps) {
  __shared__ float scratch[32];
  const int packs = columns / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * columns;
    // The row being normalized: x, or the sum once the first pass has written it.
    const T* source = kResidual ? sum_out + offset : x + offset;
    float total = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      Pack<T, kVec> v;
      if constexpr (kResidual) {
        const Pack<T, kVec> a = load_pack_streaming<T, kVec>(x + offset + p * kVec);
        const Pack<T, kVec> b = load_pack_streaming<T, kVec>(residual + offset + p * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v.set(j, a.get(j) + b.get(j));
        store_pack(sum_out + offset + p * kVec, v);
      } else {
        v = load_pack<T, kVec>(source + p * kVec);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) total += v.get(j);
    }
    const float row_mean = kCentered ? block_sum(total, scratch) / static_cast<float>(columns) : 0.0f;
    float squares = 0.0f;
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> v = load_pack<T, kVec>(source + p * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) squares += (v.get(j) - row_mean) * (v.get(j) - row_mean);
    }
    const float row_rstd = 1.0f / sqrtf(block_sum(squares, scratch) / static_cast<float>(columns) + eps);
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> v = load_pack<T, kVec>(source + p * kVec);
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
      store_pack(out + offset + p * kVec, result);
    }
    if (threadIdx.x == 0) {
      if constexpr (kCentered) mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

// --- Backward ----------------------------------------------------------------------------------

// The per-row constants of grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) with
// xhat = x * rstd + shift (shift = -mean * rstd), arranged for two fused multiply-adds per element:
// grad_x = g * rstd + (xhat * scale + offset).
struct RowGradient {
  float rstd, shift, scale, offset;
};

// From the row's rstd and shift and its reduced sums (sum g, sum g * xhat) over `columns`.
__device__ __forceinline__ RowGradient row_gradient(float row_rstd, float shift, const float (&sums)[2],
                                                   float inverse_columns) {
  return {row_rstd, shift, -row_rstd * sums[1] * inverse_columns, -row_rstd * sums[0] * inverse_columns};
}

// Adds one pack's contribution to the row sums (sum g, sum g * xhat) and to the thread's column sums
// (grad_out * xhat, grad_out).
template <class T, int kVec, bool kCentered>
__device__ __forceinline__ void accumulate_pack(const Pack<T, kVec>& x, const Pack<T, kVec>& gy, const Pack<T, kVec>& w,
                                                float row_rstd, float shift, float (&sums)[2],
                                                float (&weight_sums)[kVec], float (&bias_sums)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float xhat = fmaf(x.get(j), row_rstd, shift);
    const float grad = gy.get(j);
    const float g = grad * w.get(j);
    if constexpr (kCentered) sums[0] += g;
    sums[1] = fmaf(g, xhat, sums[1]);
    weight_sums[j] = fmaf(grad, xhat, weight_sums[j]);
    if constexpr (kCentered) bias_sums[j] += grad;
  }
}

template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> gradient_pack(const Pack<T, kVec>& x, const Pack<T, kVec>& gy,
                                                       const Pack<T, kVec>& w, const RowGradient& row) {
  Pack<T, kVec> result;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float xhat = fmaf(x.get(j), row.rstd, row.shift);
    result.set(j, fmaf(gy.get(j) * w.get(j), row.rstd, fmaf(xhat, row.scale, row.offset)));
  }
  return result;
}

// Adds the groups' column sums of a block in group order into `merged` [2, columns] (shared memory)
// and writes them to the block's partial row. Every thread of the block must call.
template <int kVec, int kPacks>
__device__ __forceinline__ void write_block_partials(const float (&weight_sums)[kPacks][kVec],
                                                     const float (&bias_sums)[kPacks][kVec], float* merged,
                                                     float* block_partials, int group, int groups, int t,
                                                     int threads_per_row, int columns, bool bias_sums_needed) {
  for (int g = 0; g < groups; ++g) {
    if (group == g) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * threads_per_row + t) * kVec;
        if (column < columns) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            merged[column + j] = (g == 0 ? 0.0f : merged[column + j]) + weight_sums[k][j];
            if (bias_sums_needed) {
              merged[columns + column + j] = (g == 0 ? 0.0f : merged[columns + column + j]) + bias_sums[k][j];
            }
          }
        }
      }
    }
    __syncthreads();
  }
  const int count = bias_sums_needed ? 2 * columns : columns;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) block_partials[i] = merged[i];
}

// Asynchronous copies into shared memory (cp.async): 16 bytes, L2 prefetching 256 bytes; 4 bytes.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(address), "l"(global));
}
__device__ __forceinline__ void copy_async_4(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(address), "l"(global));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;"); }
// Waits until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

constexpr int kPipelineStages = 2;  // rows in shared memory per group: the current one and the next

// Shared memory of the pipelined kernel, in 16-byte units, per group and stage: x and grad_out
// ([2][kPacks][threads_per_row] packs), then mean and rstd ([2][threads_per_row] floats).
__host__ __device__ constexpr int pipeline_stage_units(int packs_per_thread, int threads_per_row) {
  return 2 * packs_per_thread * threads_per_row + (2 * threads_per_row + 3) / 4;
}

// Stage 1 for rows that move in 16-byte packs (see the file comment). kPacks packs per thread;
// groups of threads_per_row threads (a multiple of 32, at most 15 groups: named barriers 1..15).
// Dynamic shared memory: max(groups * kPipelineStages * pipeline_stage_units, 2 * columns floats).
template <class T, int kVec, int kPacks, bool kCentered, int kBlockThreads, int kMinBlocks>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocks)
    norm_backward_pipelined_kernel(const T* __restrict__ x,          // [rows, columns]
                                   const T* __restrict__ weight,     // [columns]
                                   const float* __restrict__ mean,   // [rows] (layer norm only)
                                   const float* __restrict__ rstd,   // [rows]
                                   const T* __restrict__ grad_out,   // [rows, columns]
                                   T* __restrict__ grad_x,           // [rows, columns]
                                   float* __restrict__ partials,     // [gridDim.x, 2, columns]
                                   int64_t rows, int columns, int threads_per_row, bool with_bias) {
  static_assert(sizeof(Pack<T, kVec>) == 16, "the copy pipeline moves 16-byte packs");
  __shared__ float scratch[2 * 2 * kBlockThreads / 32];
  extern __shared__ int4 ring[];
  const int group = static_cast<int>(threadIdx.x) / threads_per_row;
  const int t = static_cast<int>(threadIdx.x) % threads_per_row;
  const int groups = static_cast<int>(blockDim.x) / threads_per_row;
  const int packs = columns / kVec;
  const float inverse_columns = 1.0f / static_cast<float>(columns);
  const int stage_units = pipeline_stage_units(kPacks, threads_per_row);
  const int stage_packs = 2 * kPacks * threads_per_row;
  int4* group_ring = ring + static_cast<int64_t>(group) * kPipelineStages * stage_units;
  float weight_sums[kPacks][kVec], bias_sums[kPacks][kVec];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) weight_sums[k][j] = bias_sums[k][j] = 0.0f;
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups + group;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups;
  // Copies this thread's part of `row` into `stage`; always commits a group (empty past the end),
  // so that wait_copies counts the same groups on every thread.
  auto prefetch = [&](int64_t row, int stage) {
    if (row < rows) {
      int4* slot = group_ring + stage * stage_units;
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int p = k * threads_per_row + t;
        if (p < packs) {
          const int64_t offset = row * columns + static_cast<int64_t>(p) * kVec;
          copy_async_16(slot + k * threads_per_row + t, x + offset);
          copy_async_16(slot + (kPacks + k) * threads_per_row + t, grad_out + offset);
        }
      }
      float* statistics = reinterpret_cast<float*>(slot + stage_packs);
      if (kCentered) copy_async_4(statistics + t, mean + row);
      copy_async_4(statistics + threads_per_row + t, rstd + row);
    }
    commit_copies();
  };
  auto read = [&](const int4* slot, int k, Pack<T, kVec>& xs, Pack<T, kVec>& gys) {
    const int4 a = slot[k * threads_per_row + t], b = slot[(kPacks + k) * threads_per_row + t];
    memcpy(&xs, &a, 16);
    memcpy(&gys, &b, 16);
  };
  int parity = 0, stage = 0;
  prefetch(first, 0);
  for (int64_t row = first; row < rows; row += step) {
    // The slot refilled here was last read in the previous round, by this thread, before its stores.
    prefetch(row + step, stage ^ 1);
    wait_copies<1>();
    const int4* slot = group_ring + stage * stage_units;
    const float* statistics = reinterpret_cast<const float*>(slot + stage_packs);
    const float row_rstd = statistics[threads_per_row + t];
    const float shift = kCentered ? -statistics[t] * row_rstd : 0.0f;
    // The row's packs are all read before the arithmetic starts (as in the forward), and read again
    // after the reduction rather than kept (see below).
    Pack<T, kVec> xs[kPacks], gys[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (k * threads_per_row + t < packs) read(slot, k, xs[k], gys[k]);
    }
    float sums[2] = {0.0f, 0.0f};  // sum(g), sum(g * xhat)
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = k * threads_per_row + t;
      if (p < packs) {
        // weight is re-read per row from L1: holding it in registers costs occupancy.
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
        accumulate_pack<T, kVec, kCentered>(xs[k], gys[k], w, row_rstd, shift, sums, weight_sums[k], bias_sums[k]);
      }
    }
    asm volatile("" ::: "memory");  // keeps the second reads below from being merged with the first
    group_sum(sums, scratch, parity, group, t, threads_per_row);
    const RowGradient gradient = row_gradient(row_rstd, shift, sums, inverse_columns);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = k * threads_per_row + t;
      if (p < packs) {
        // x and grad_out are read again from shared memory rather than held in registers across the
        // reduction: fewer registers, more resident warps.
        read(slot, k, xs[k], gys[k]);
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
        store_pack(grad_x + row * columns + static_cast<int64_t>(p) * kVec, gradient_pack(xs[k], gys[k], w, gradient));
      }
    }
    stage ^= 1;
  }
  wait_copies<0>();
  __syncthreads();  // the ring is reused as `merged` below
  write_block_partials<kVec, kPacks>(weight_sums, bias_sums, reinterpret_cast<float*>(ring),
                                     partials + static_cast<int64_t>(blockIdx.x) * 2 * columns, group, groups, t,
                                     threads_per_row, columns, kCentered && with_bias);
}

// Stage 1 for rows that do not move in packs (kVec 1: odd C, misaligned views): the same sums, with
// the row held in registers and no copy pipeline. Dynamic shared memory: 2 * columns floats when a
// block holds several rows (to add the rows' sums in order), else none.
constexpr int kRegisterBackwardValues = 16;  // row elements per thread

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
  constexpr int kPacks = kRegisterBackwardValues / kVec;
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
    const float row_rstd = row_valid ? rstd[row] : 0.0f;
    const float shift = kCentered && row_valid ? -mean[row] * row_rstd : 0.0f;
    Pack<T, kVec> xs[kPacks], gys[kPacks];
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (row_valid && column < columns) {
        xs[k] = load_pack<T, kVec>(x + offset + column);
        gys[k] = load_pack<T, kVec>(grad_out + offset + column);
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + column);
        accumulate_pack<T, kVec, kCentered>(xs[k], gys[k], w, row_rstd, shift, sums, weight_sums[k], bias_sums[k]);
      }
    }
    row_sum<kMultiWarp>(sums, scratch, warps_per_row);
    if (!row_valid) continue;
    const RowGradient gradient = row_gradient(row_rstd, shift, sums, inverse_columns);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * threads_per_row + t) * kVec;
      if (column < columns) {
        const Pack<T, kVec> w = load_pack<T, kVec>(weight + column);
        store_pack(grad_x + offset + column, gradient_pack(xs[k], gys[k], w, gradient));
      }
    }
  }
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
  write_block_partials<kVec, kPacks>(weight_sums, bias_sums, merged, block_partials, group, rows_per_block, t,
                                     threads_per_row, columns, bias_sums_needed);
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
    const float row_rstd = rstd[row];
    const float shift = kCentered ? -mean[row] * row_rstd : 0.0f;
    float sums[2] = {0.0f, 0.0f};
    float unused_weight_sums[kVec], unused_bias_sums[kVec];
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> xv = load_pack<T, kVec>(x + offset + p * kVec);
      const Pack<T, kVec> gy = load_pack<T, kVec>(grad_out + offset + p * kVec);
      const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) unused_weight_sums[j] = unused_bias_sums[j] = 0.0f;
      accumulate_pack<T, kVec, kCentered>(xv, gy, w, row_rstd, shift, sums, unused_weight_sums, unused_bias_sums);
    }
    if (kCentered) sums[0] = block_sum(sums[0], scratch);
    sums[1] = block_sum(sums[1], scratch);
    const RowGradient gradient = row_gradient(row_rstd, shift, sums, inverse_columns);
    for (int p = static_cast<int>(threadIdx.x); p < packs; p += blockDim.x) {
      const Pack<T, kVec> xv = load_pack<T, kVec>(x + offset + p * kVec);
      const Pack<T, kVec> gy = load_pack<T, kVec>(grad_out + offset + p * kVec);
      const Pack<T, kVec> w = load_pack<T, kVec>(weight + p * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xhat = fmaf(xv.get(j), row_rstd, shift);
        block_partials[p * kVec + j] += gy.get(j) * xhat;
        if (bias_sums_needed) block_partials[columns + p * kVec + j] += gy.get(j);
      }
      store_pack(grad_x + offset + p * kVec, gradient_pack(xv, gy, w, gradient));
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

template <class T, bool kCentered, bool kResidual>
void launch_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                         const Tensor& sum_out, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         cudaStream_t stream) {
  const int columns = static_cast<int>(x.size(-1));
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  if (rows == 0) return;
  const T* in = x.data<T>();
  const T* res = kResidual ? residual.data<T>() : nullptr;
  const T* w = weight.data<T>();
  const T* b = bias.defined() ? bias.data<T>() : nullptr;
  T* sum_data = kResidual ? sum_out.data<T>() : nullptr;
  T* data = out.data<T>();
  float* mean_data = kCentered ? mean.data<float>() : nullptr;
  float* rstd_data = rstd.data<float>();
  bool packed = can_use_packs<T>(columns, in, w, data) && (b == nullptr || is_aligned_16(b));
  if constexpr (kResidual) packed = packed && is_aligned_16(res) && is_aligned_16(sum_data);
  const float epsilon = static_cast<float>(eps);
  dispatch_pack<T>(packed, [&]<int kVec>() {
    const int packs = columns / kVec;
    auto launch = [&]<int kPacks, bool kMultiWarp>(int threads_per_row, int block_threads) {
      const int rows_per_block = block_threads / threads_per_row;
      auto run = [&]<int kBlockThreads>() {
        norm_forward_kernel<T, kVec, kPacks, kMultiWarp, kCentered, kResidual, kBlockThreads>
            <<<grid_for(rows, rows_per_block), block_threads, 0, stream>>>(
                in, res, w, b, sum_data, data, mean_data, rstd_data, rows, columns, threads_per_row, epsilon);
      };
      if (block_threads <= kMinBlockThreads) {
        run.template operator()<kMinBlockThreads>();
      } else {
        run.template operator()<kMaxThreads>();
      }
    };
    // A warp per row when the row fits in kPacks per lane (packed rows only: single elements would
    // leave a warp with too little to load at once).
    constexpr int kPacks = forward_packs(kVec);
    if constexpr (kVec > 1) {
      if (dispatch_warp_packs(packs, [&]<int kLanePacks>() {
            launch.template operator()<kLanePacks, false>(32, kMinBlockThreads);
          })) {
        WEFT_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    const RowSplit split = split_row(packs, kPacks);
    if (!split.fits) {
      norm_forward_streaming_kernel<T, kVec, kCentered, kResidual><<<grid_for(rows, 1), kStreamingThreads, 0, stream>>>(
          in, res, w, b, sum_data, data, mean_data, rstd_data, rows, columns, epsilon);
    } else if (split.threads_per_row == 32) {
      launch.template operator()<kPacks, false>(split.threads_per_row, split.block_threads);
    } else {
      launch.template operator()<kPacks, true>(split.threads_per_row, split.block_threads);
    }
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

// Resident blocks of `kernel` on the whole device: the size of a persistent grid.
int resident_blocks(const void* kernel, int block_threads, size_t shared_bytes, int device) {
  int per_multiprocessor = 0;
  WEFT_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, block_threads, shared_bytes));
  return std::max(per_multiprocessor, 1) * multiprocessor_count(device);
}

// Allows `kernel` more than the default 48 KiB of dynamic shared memory when it needs it.
void allow_shared_memory(const void* kernel, size_t shared_bytes) {
  if (shared_bytes > 48 * 1024) {
    WEFT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
  }
}

// The pipelined stage 1's configurations (measured on the H200, docs/performance.md): rows of up to
// 96 packs (C = 768 at bf16) take a warp per row holding up to 3 packs per lane, 4 warps per block;
// longer rows (up to 1024 packs) take groups of 2 packs per thread, 256 threads or one group a block.
constexpr int kPipelinedWarpPacks = 96;
constexpr int kPipelinedMaxPacks = 1024;

template <class T, int kVec, bool kCentered>
bool launch_norm_backward_pipelined(const T* in, const T* w, const float* mean_data, const float* rstd_data,
                                    const T* gy, T* gx, int64_t rows, int columns, bool with_bias, int device,
                                    cudaStream_t stream, Tensor& partials, int& blocks) {
  const int packs = columns / kVec;
  if (packs > kPipelinedMaxPacks) return false;
  auto launch = [&]<int kPacks, int kBlockThreads, int kMinBlocks>(int threads_per_row) {
    const auto kernel = norm_backward_pipelined_kernel<T, kVec, kPacks, kCentered, kBlockThreads, kMinBlocks>;
    const int groups = std::max(1, kBlockThreads / threads_per_row);
    const int block_threads = groups * threads_per_row;
    const size_t shared_bytes =
        std::max(sizeof(int4) * groups * kPipelineStages * pipeline_stage_units(kPacks, threads_per_row),
                 sizeof(float) * 2 * columns);
    allow_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
    const int64_t needed = (rows + groups - 1) / groups;
    blocks = static_cast<int>(std::min<int64_t>(
        needed, resident_blocks(reinterpret_cast<const void*>(kernel), block_threads, shared_bytes, device)));
    partials = Tensor::empty({blocks, 2, columns}, kFloat32, Device::cuda(device));
    kernel<<<blocks, block_threads, shared_bytes, stream>>>(in, w, mean_data, rstd_data, gy, gx, partials.data<float>(),
                                                            rows, columns, threads_per_row, with_bias);
    WEFT_CUDA_CHECK_LAUNCH();
  };
  if (packs <= 32) {
    launch.template operator()<1, 128, 4>(32);
  } else if (packs <= 64) {
    launch.template operator()<2, 128, 4>(32);
  } else if (packs <= kPipelinedWarpPacks) {
    launch.template operator()<3, 128, 4>(32);
  } else {
    int threads_per_row = 64;
    while (threads_per_row * 2 < packs) threads_per_row *= 2;
    if (threads_per_row <= 256) {
      launch.template operator()<2, 256, 2>(threads_per_row);
    } else {
      launch.template operator()<2, 512, 1>(threads_per_row);
    }
  }
  return true;
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
  // cp.async reads mean and rstd 4 bytes at a time and the rows 16 at a time.
  const bool packed = can_use_packs<T>(columns, in, w, gy, gx);
  int blocks = 0;
  Tensor partials;
  dispatch_pack<T>(packed, [&]<int kVec>() {
    if constexpr (kVec > 1) {
      if (launch_norm_backward_pipelined<T, kVec, kCentered>(in, w, mean_data, rstd_data, gy, gx, rows, columns,
                                                             with_bias, device, stream, partials, blocks)) {
        return;
      }
    }
    const RowSplit split = split_row(columns / kVec, kRegisterBackwardValues / kVec);
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
      allow_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
      // A persistent grid: as many blocks as are resident at once, so that there are few partial rows.
      const int64_t needed = (rows + rows_per_block - 1) / rows_per_block;
      blocks = static_cast<int>(std::min<int64_t>(
          needed, resident_blocks(reinterpret_cast<const void*>(kernel), split.block_threads, shared_bytes, device)));
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
    cuda::launch_norm_forward<T, true, false>(x, Tensor(), weight, bias, eps, Tensor(), out, mean, rstd, stream);
  });
}

void CudaBackend::add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                 double eps, const Tensor& sum_out, const Tensor& out, const Tensor& mean,
                                 const Tensor& rstd) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "add_layer_norm", [&]<class T>() {
    cuda::launch_norm_forward<T, true, true>(x, residual, weight, bias, eps, sum_out, out, mean, rstd, stream);
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
    cuda::launch_norm_forward<T, false, false>(x, Tensor(), weight, Tensor(), eps, Tensor(), out, Tensor(), rstd,
                                               stream);
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
