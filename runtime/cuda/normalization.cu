// CUDA kernels: layer norm and RMS norm over the last dim of a contiguous [N, C] tensor, forward and
// backward, and the residual add fused with the layer norm forward (CudaBackend::layer_norm,
// layer_norm_backward, rms_norm, rms_norm_backward, add_layer_norm, add_rms_norm; the CPU
// reference, with the formulas, is runtime/cpu/normalization.cc).
//
// Forward: a row is handled by one warp when it fits in at most 4 packs (16 bytes each) per lane
// (C <= 1024 at bf16, 512 at f32), else by a group of 64..512 threads (a compile-time size: the
// group reduces through shared memory behind a named barrier of its own, with the barrier id in the
// instruction, so the other rows of the block do not wait and the kernel is not capped at 4 blocks
// per SM); each thread holds its columns in registers, so x is read once (ld.global.nc with an L2
// 256-byte prefetch) and out written once.
// Mean and variance are two passes over registers (as on the CPU, no E[x^2] - E[x]^2
// cancellation); mean and rstd are written as f32 [N]. The packs per thread are the fewest that cover
// the row, up to 4, and every load of a row is issued before the arithmetic starts (measurements:
// forward_packs below). With a residual (add_layer_norm), each thread adds x and residual in f32,
// rounds the sum to the stored dtype (the unfused add stores it so) and writes it to sum_out; the
// statistics are taken over the rounded sum.
//
// Backward, in two stages so that grad_weight / grad_bias need neither atomics nor a second pass over
// x and grad_out:
//   1. A persistent grid of one block per SM walks the rows, one row per group of threads (a warp
//      for C <= 768 at bf16, 10 rows a block; else 64..512 threads reducing as in the forward, 512
//      threads a block); row r goes to block r % blocks, so a last partial round is spread over all
//      SMs. Each thread copies its own packs of x, grad_out and the grad_x addend (if any) for the
//      next rows (two ahead for warp rows, one for larger groups) into its own shared-memory slots
//      with cp.async while it computes the current row (and loads those rows' mean and rstd), and
//      reads back only what it copied itself (no barrier for the data); its weight packs stay in
//      registers. Per row it reduces mean(g) and mean(g * xhat) (g = grad_out * weight), writes
//      grad_x (from x and grad_out held in registers since the first pass, where they fit), and
//      keeps running sums of grad_out * xhat and grad_out for its own columns in registers. At the
//      end the block adds its groups' sums in a fixed order and writes one partial row: partials
//      [blocks, 2, C] f32 (scratch from the caching allocator). Where grad_x's column sums are
//      asked (NormBackwardExtras::grad_x_column_sums: the bias gradient of the linear before the
//      norm) and the rows are warp rows, the threads also sum the grad_x values they store, and the
//      partials have a third row; other rows leave those sums to a column-sum pass after stage 2.
//   2. A small kernel sums the partial rows per column in a fixed order and writes (=) grad_weight
//      and grad_bias in the weight's dtype, or adds into them (NormBackwardExtras'
//      accumulate_parameter_gradients: the parameters' .grad itself), and writes grad_x's sums.
// A grad_x addend (NormBackwardExtras: the residual stream's gradient) is added in f32 before the
// rounding of grad_x, so the residual add costs one read of the addend instead of a separate pass
// that reads two tensors and writes one. The pipelined kernel copies it with the row; the others
// read it with the store. (Read with the store, each row's load waited out its latency: 48.8
// against 41.3 us at [16384, 768] bf16 on an H100.)
// Every kernel here is launched as a programmatic dependent (dependent_launch.cuh): its blocks are
// placed while the kernel before it finishes (stage 2's while stage 1 finishes), and it waits for its
// predecessor's results before touching global memory. At 15-30 us a call, the launch gap this hides
// is several points of copy bandwidth (layer norm backward at [16384, 768] bf16: 68% -> 73% on the
// H200).
// Every reduction has a fixed order, so results are the same from run to run. Rows that do not move
// in 16-byte packs (odd C, misaligned views) take a register kernel without the copy pipeline; rows
// longer than the register paths hold (forward C > 16384 at bf16; backward C > 16384 at bf16, C > 8192
// without packs) take a streaming block-per-row fallback that re-reads the row.
#include <algorithm>
#include <cmath>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/dynamic_shared_memory.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kStreamingThreads = 512;  // fallback: one block per row

// --- Row groups ----------------------------------------------------------------------------------

// Calls body.template operator()<kThreadsPerRow>() with the smallest row group of 64..512 threads
// whose threads hold `packs` in `packs_per_thread` each; false when even 512 threads cannot (the
// streaming fallback). Group sizes are compile-time: the barrier ids, the column stride and the
// block's group count are constants in the kernels.
template <class Body>
bool dispatch_row_group(int packs, int packs_per_thread, Body&& body) {
  if (packs <= 64 * packs_per_thread) { body.template operator()<64>(); return true; }
  if (packs <= 128 * packs_per_thread) { body.template operator()<128>(); return true; }
  if (packs <= 256 * packs_per_thread) { body.template operator()<256>(); return true; }
  if (packs <= 512 * packs_per_thread) { body.template operator()<512>(); return true; }
  return false;
}

// The most packs a forward thread holds: 4 packs of 16 bytes, or 16 single elements when the row
// does not move in packs. Measured on the H200 at C = 2048 bf16 (docs/performance.md): on a warp per
// row with 8 packs per lane layer_norm ran at 63% of copy bandwidth and add_layer_norm (8 packs of x
// and 8 of the residual) at 59%; on two warps with 4 packs each, at 68-69% and 76-80% (73-75% once
// the group size was a compile-time constant with immediate barrier ids).
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

// kCentered: layer norm (subtract the mean, optional bias); otherwise RMS norm. kResidual
// (add_layer_norm, add_rms_norm): the normalized row is x + residual, rounded to T and written to
// sum_out.
// Row groups of kThreadsPerRow threads, kBlockThreads / kThreadsPerRow rows per block. The launch
// bound asks for half the SM's threads resident (64 registers a thread; 85 with a residual, which
// holds twice the loads, and 128 for rows without packs, which hold 16 single elements): left to
// itself the compiler took 82-95 registers on the two-warp rows of C = 2048, two blocks per SM, and
// the kernel ran at 53% of copy bandwidth (68% at 62 registers, H200).
constexpr int forward_min_blocks(int vec, bool residual, int block_threads) {
  return (vec == 1 ? 512 : residual ? 768 : 1024) / block_threads;
}

// Block size for row groups of `threads_per_row`: 256 threads (8 warp rows), 128 for two-warp rows
// (measured: 75% against 73% with 256 at C = 2048 bf16), else one group.
__host__ __device__ constexpr int forward_block_threads(int threads_per_row) {
  return threads_per_row == 64 ? 128 : threads_per_row < 256 ? 256 : threads_per_row;
}

template <class T, int kVec, int kPacks, int kThreadsPerRow, bool kCentered, bool kResidual>
__global__ void __launch_bounds__(forward_block_threads(kThreadsPerRow),
                                  forward_min_blocks(kVec, kResidual, forward_block_threads(kThreadsPerRow)))
    norm_forward_kernel(const T* __restrict__ x,         // [rows, columns]
                        const T* __restrict__ residual,  // [rows, columns] (kResidual only)
                        const T* __restrict__ weight,    // [columns]
                        const T* __restrict__ bias,      // [columns] or null
                        T* __restrict__ sum_out,         // [rows, columns] (kResidual only)
                        T* __restrict__ out,             // [rows, columns]
                        float* __restrict__ mean,        // [rows] (layer norm only)
                        float* __restrict__ rstd,        // [rows]
                        int64_t rows, int columns, float eps) {
  constexpr int kGroups = forward_block_threads(kThreadsPerRow) / kThreadsPerRow;
  __shared__ float scratch[kGroupSumScratch<kThreadsPerRow, kGroups, 1>];
  const int group = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int t = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  int parity = 0;
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kGroups; base < rows;
       base += static_cast<int64_t>(gridDim.x) * kGroups) {
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
        const int column = (k * kThreadsPerRow + t) * kVec;
        if (row_valid && column < columns) {
          v[k] = load_pack_once<T, kVec>(x + offset + column);
          addend[k] = load_pack_once<T, kVec>(residual + offset + column);
        }
      }
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * kThreadsPerRow + t) * kVec;
        if (row_valid && column < columns) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) v[k].set(j, v[k].get(j) + addend[k].get(j));  // rounded to T
          store_pack(sum_out + offset + column, v[k]);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * kThreadsPerRow + t) * kVec;
        if (row_valid && column < columns) v[k] = load_pack_once<T, kVec>(x + offset + column);
      }
    }
    float row_mean = 0.0f;
    if constexpr (kCentered) {
      float sums[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int column = (k * kThreadsPerRow + t) * kVec;
        if (row_valid && column < columns) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) sums[0] += v[k].get(j);
        }
      }
      group_sum<kThreadsPerRow, kGroups>(sums, scratch, parity, group, t);
      row_mean = sums[0] / static_cast<float>(columns);
    }
    float squares[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * kThreadsPerRow + t) * kVec;
      if (row_valid && column < columns) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float centered = v[k].get(j) - row_mean;
          squares[0] += centered * centered;
        }
      }
    }
    group_sum<kThreadsPerRow, kGroups>(squares, scratch, parity, group, t);
    const float row_rstd = 1.0f / sqrtf(squares[0] / static_cast<float>(columns) + eps);
    if (!row_valid) continue;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = (k * kThreadsPerRow + t) * kVec;
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
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
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

// The per-row constants of grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = grad_out *
// weight and xhat = x * rstd + shift (shift = -mean * rstd), arranged for three instructions per
// element: grad_x = grad_out * (weight * rstd) + (x * x_scale + constant).
struct RowGradient {
  float rstd, shift, x_scale, constant;
};

// From the row's rstd and shift and its reduced sums (sum g, sum g * xhat) over `columns`.
__device__ __forceinline__ RowGradient row_gradient(float row_rstd, float shift, const float (&sums)[2],
                                                   float inverse_columns) {
  const float scale = -row_rstd * sums[1] * inverse_columns;  // coefficient of xhat
  const float offset = -row_rstd * sums[0] * inverse_columns;
  return {row_rstd, shift, row_rstd * scale, fmaf(shift, scale, offset)};
}

template <class T, int kVec>
__device__ __forceinline__ void widen(const Pack<T, kVec>& pack, float (&values)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) values[j] = pack.get(j);
}

// Adds one pack's contribution to the row sums (sum g, sum g * xhat) and to the thread's column sums
// (grad_out * xhat, grad_out).
template <class T, int kVec, bool kCentered>
__device__ __forceinline__ void accumulate_pack(const Pack<T, kVec>& x, const Pack<T, kVec>& gy, const float (&w)[kVec],
                                                float row_rstd, float shift, float (&sums)[2],
                                                float (&weight_sums)[kVec], float (&bias_sums)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float xhat = fmaf(x.get(j), row_rstd, shift);
    const float grad = gy.get(j);
    const float g = grad * w[j];
    if constexpr (kCentered) sums[0] += g;
    sums[1] = fmaf(g, xhat, sums[1]);
    weight_sums[j] = fmaf(grad, xhat, weight_sums[j]);
    if constexpr (kCentered) bias_sums[j] += grad;
  }
}

// One pack of grad_x plus the addend's pack `extra`, added in f32 before the rounding.
template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> gradient_pack_plus(const Pack<T, kVec>& x, const Pack<T, kVec>& gy,
                                                            const float (&w)[kVec], const RowGradient& row,
                                                            const Pack<T, kVec>& extra) {
  Pack<T, kVec> result;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    result.set(j, fmaf(gy.get(j), w[j] * row.rstd, fmaf(x.get(j), row.x_scale, row.constant)) + extra.get(j));
  }
  return result;
}

// One pack of grad_x, plus the addend's pack at `addend` when it is not null (the row's addend
// pointer is null or not for the whole grid, so the branch does not diverge).
template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> gradient_pack(const Pack<T, kVec>& x, const Pack<T, kVec>& gy,
                                                       const float (&w)[kVec], const RowGradient& row,
                                                       const T* addend) {
  if (addend != nullptr) return gradient_pack_plus(x, gy, w, row, load_pack<T, kVec>(addend));
  Pack<T, kVec> result;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    result.set(j, fmaf(gy.get(j), w[j] * row.rstd, fmaf(x.get(j), row.x_scale, row.constant)));
  }
  return result;
}

// The addend's element at `offset`, or null without one.
template <class T>
__device__ __forceinline__ const T* addend_at(const T* addend, int64_t offset) {
  return addend != nullptr ? addend + offset : nullptr;
}

// Writes the block's partial row: each row group's column sums go to its own slice of `merged`
// ([groups][sums][columns] floats of shared memory, free for this use), then every thread adds the
// groups' values of its columns in group order. Every thread of the block must call. `trigger`:
// let the dependent launch (stage 2) start its blocks once every block of this grid has come here.
// The sums: grad_weight's, then grad_bias's where needed; with kGradXSums, grad_x's third (after a
// row of zeros where grad_bias's are not needed), so that they stay at row 2 of the partial rows.
template <int kVec, int kPacks, int kThreadsPerRow, bool kGradXSums = false>
__device__ __forceinline__ void write_block_partials(const float (&weight_sums)[kPacks][kVec],
                                                     const float (&bias_sums)[kPacks][kVec],
                                                     const float (&grad_x_sums)[kPacks][kVec], float* merged,
                                                     float* block_partials, int group, int groups, int t,
                                                     int columns, bool bias_sums_needed, bool trigger) {
  const int sums = kGradXSums ? 3 : bias_sums_needed ? 2 : 1;
  float* mine = merged + static_cast<int64_t>(group) * sums * columns;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int column = (k * kThreadsPerRow + t) * kVec;
    if (column < columns) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        mine[column + j] = weight_sums[k][j];
        if (bias_sums_needed || kGradXSums) mine[columns + column + j] = bias_sums_needed ? bias_sums[k][j] : 0.0f;
        if constexpr (kGradXSums) mine[2 * columns + column + j] = grad_x_sums[k][j];
      }
    }
  }
  __syncthreads();
  if (trigger) allow_next_kernel_to_start();
  for (int i = static_cast<int>(threadIdx.x); i < sums * columns; i += blockDim.x) {
    float total = 0.0f;
    for (int g = 0; g < groups; ++g) total += merged[g * sums * columns + i];
    block_partials[i] = total;
  }
}

// Asynchronous copy into shared memory (cp.async): 16 bytes, L2 prefetching 256 bytes.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(address), "l"(global));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;"); }
// Waits until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

// Threads of a pipelined block (one block per SM: the launch bound asks for no more). Warp rows take
// 10 warps: measured on the H200 at C = 768 bf16 with the row held between the passes, layer norm
// backward ran at 67% / 68% / 67% / 66% / 64% of copy bandwidth with 8 / 10 / 12 / 14 / 16 warps
// (fewer rows in flight, but more registers a thread: 142 for layer norm's 3-pack warp rows).
__host__ __device__ constexpr int pipeline_block_threads(int threads_per_row) {
  return threads_per_row == 32 ? 320 : 512;
}

// Rows in shared memory per group: the current one and the next (groups of 64..512 threads), or the
// current one and the next two (warp rows, whose 10 rows a block otherwise had too few bytes in
// flight to cover the memory's latency; docs/performance.md, 2026-12-06, twenty-fifth session).
__host__ __device__ constexpr int pipeline_stages(int threads_per_row) { return threads_per_row == 32 ? 3 : 2; }

// The tensors a row's stage holds: x and grad_out, and the grad_x addend when there is one (read
// with the copies rather than at the store, where each row's load would wait out the latency).
__host__ __device__ constexpr int pipeline_tensors(bool with_addend) { return with_addend ? 3 : 2; }

// Shared memory of the pipelined kernel, in 16-byte units, per group and stage: x, grad_out and the
// addend if any ([tensors][kPacks][threads_per_row] packs).
__host__ __device__ constexpr int pipeline_stage_units(int packs_per_thread, int threads_per_row, bool with_addend) {
  return pipeline_tensors(with_addend) * packs_per_thread * threads_per_row;
}

// Dynamic shared memory of the pipelined kernel: the ring during the row loop, then the groups'
// column sums (`merged`, `partial_sums` rows of them) at the end.
constexpr size_t pipeline_shared_bytes(int packs_per_thread, int threads_per_row, bool with_addend, int columns,
                                       int partial_sums) {
  const int groups = pipeline_block_threads(threads_per_row) / threads_per_row;
  const size_t ring = sizeof(int4) * groups * pipeline_stages(threads_per_row) *
                      pipeline_stage_units(packs_per_thread, threads_per_row, with_addend);
  const size_t merged = sizeof(float) * groups * partial_sums * columns;
  return std::max(ring, merged);
}

// Stage 1 for rows that move in 16-byte packs (see the file comment). kPacks packs per thread,
// groups of kThreadsPerRow threads; kAddend: grad_x_addend is not null and comes through the ring;
// kGradXSums: the thread also sums the grad_x it stores, per column (NormBackwardExtras::
// grad_x_column_sums), into partial row 2 (three rows a block, else two).
// Dynamic shared memory: pipeline_shared_bytes.
// Measured on the H200 (docs/performance.md): against the previous kernel (runtime group size, 4
// blocks of 128 threads per SM, the barrier limit), the compile-time group size, one block per SM
// and the cheaper bf16 widening cut the instructions per row by a quarter. The kernel issues on
// about half the cycles and its shared-memory pipe is busy: the thread's weight packs stay in
// registers for the whole grid (read from L1 or from a shared f32 copy per row, 54-61% of copy
// bandwidth at C = 768; from registers, 63-64%).
template <class T, int kVec, int kPacks, int kThreadsPerRow, bool kCentered, bool kAddend, bool kGradXSums>
__global__ void __launch_bounds__(pipeline_block_threads(kThreadsPerRow), 1)
    norm_backward_pipelined_kernel(const T* __restrict__ x,          // [rows, columns]
                                   const T* __restrict__ weight,     // [columns]
                                   const float* __restrict__ mean,   // [rows] (layer norm only)
                                   const float* __restrict__ rstd,   // [rows]
                                   const T* __restrict__ grad_out,   // [rows, columns]
                                   const T* __restrict__ grad_x_addend,  // [rows, columns] (kAddend) or null
                                   T* __restrict__ grad_x,           // [rows, columns]
                                   float* __restrict__ partials,     // [gridDim.x, 2 or 3, columns]
                                   int64_t rows, int columns, bool with_bias) {
  static_assert(sizeof(Pack<T, kVec>) == 16, "the copy pipeline moves 16-byte packs");
  constexpr int kPartialSums = kGradXSums ? 3 : 2;
  constexpr int kGroups = pipeline_block_threads(kThreadsPerRow) / kThreadsPerRow;
  constexpr int kStages = pipeline_stages(kThreadsPerRow);
  constexpr int kUnits = pipeline_stage_units(kPacks, kThreadsPerRow, kAddend);
  __shared__ float scratch[kGroupSumScratch<kThreadsPerRow, kGroups, 2>];
  extern __shared__ int4 ring[];  // [kGroups][kStages][kUnits]
  const int group = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int t = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int packs = columns / kVec;
  const float inverse_columns = 1.0f / static_cast<float>(columns);
  int4* group_ring = ring + group * kStages * kUnits;
  // Whether x and grad_out stay in registers from the first pass to the second, or are read again
  // from shared memory after the reduction (the shared-memory pipe is the busy one). Holding them
  // costs 8 registers a pack; layer norm's 4-pack rows (512 threads, at most 128 registers, with
  // column sums for grad_weight and grad_bias) would spill, so they read again.
  constexpr bool kHoldRow = !(kCentered && kPacks >= 4);
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  bool has_pack[kPacks];
  Pack<T, kVec> weight_packs[kPacks];
  float weight_sums[kPacks][kVec], bias_sums[kPacks][kVec];
  float grad_x_sums[kGradXSums ? kPacks : 1][kVec];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    has_pack[k] = k * kThreadsPerRow + t < packs;
    if (has_pack[k]) weight_packs[k] = load_pack<T, kVec>(weight + (k * kThreadsPerRow + t) * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      weight_sums[k][j] = bias_sums[k][j] = 0.0f;
      if constexpr (kGradXSums) grad_x_sums[k][j] = 0.0f;
    }
  }
  // Rows go round the blocks first (row r to block r % blocks), so that when the rows do not divide
  // evenly, the last round's rows are spread over all SMs instead of filling the first ones.
  const int64_t first = static_cast<int64_t>(group) * gridDim.x + blockIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kGroups;
  // Copies this thread's part of `row` into `stage`; always commits a group (empty past the end),
  // so that wait_copies counts the same groups on every thread. The row's mean and rstd come with
  // plain loads into registers, as far ahead as the copies, and move down one place a row:
  // ahead_*[0] is the next row's (in shared memory they cost two copies and two reads per row on
  // the busy shared-memory pipe).
  float ahead_mean[kStages - 1] = {}, ahead_rstd[kStages - 1] = {};
  auto prefetch = [&](int64_t row, int stage) {
#pragma unroll
    for (int i = 0; i + 1 < kStages - 1; ++i) {
      ahead_mean[i] = ahead_mean[i + 1];
      ahead_rstd[i] = ahead_rstd[i + 1];
    }
    if (row < rows) {
      int4* slot = group_ring + stage * kUnits + t;
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        if (has_pack[k]) {
          const int64_t offset = row * columns + static_cast<int64_t>(k * kThreadsPerRow + t) * kVec;
          copy_async_16(slot + k * kThreadsPerRow, x + offset);
          copy_async_16(slot + (kPacks + k) * kThreadsPerRow, grad_out + offset);
          if constexpr (kAddend) copy_async_16(slot + (2 * kPacks + k) * kThreadsPerRow, grad_x_addend + offset);
        }
      }
      if (kCentered) ahead_mean[kStages - 2] = mean[row];
      ahead_rstd[kStages - 2] = rstd[row];
    }
    commit_copies();
  };
  auto read = [&](const int4* slot, int k, Pack<T, kVec>& xs, Pack<T, kVec>& gys, float (&w)[kVec]) {
    const int4 a = slot[k * kThreadsPerRow], b = slot[(kPacks + k) * kThreadsPerRow];
    memcpy(&xs, &a, 16);
    memcpy(&gys, &b, 16);
    widen(weight_packs[k], w);
  };
  int parity = 0, stage = 0;
#pragma unroll
  for (int s = 0; s + 1 < kStages; ++s) prefetch(first + s * step, s);
  for (int64_t row = first; row < rows; row += step) {
    const float row_rstd = ahead_rstd[0];
    const float shift = kCentered ? -ahead_mean[0] * row_rstd : 0.0f;
    // The slot refilled here (the one before this row's) was last read in the previous round, by
    // this thread, before its stores.
    prefetch(row + (kStages - 1) * step, stage == 0 ? kStages - 1 : stage - 1);
    wait_copies<kStages - 1>();
    const int4* slot = group_ring + stage * kUnits + t;
    float sums[2] = {0.0f, 0.0f};  // sum(g), sum(g * xhat)
    Pack<T, kVec> held_x[kHoldRow ? kPacks : 1], held_grad[kHoldRow ? kPacks : 1];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (has_pack[k]) {
        Pack<T, kVec> xs, gys;
        float w[kVec];
        read(slot, k, xs, gys, w);
        accumulate_pack<T, kVec, kCentered>(xs, gys, w, row_rstd, shift, sums, weight_sums[k], bias_sums[k]);
        if constexpr (kHoldRow) {
          held_x[k] = xs;
          held_grad[k] = gys;
        }
      }
    }
    asm volatile("" ::: "memory");  // keeps the second reads below from being merged with the first
    group_sum<kThreadsPerRow, kGroups>(sums, scratch, parity, group, t);
    const RowGradient gradient = row_gradient(row_rstd, shift, sums, inverse_columns);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (has_pack[k]) {
        Pack<T, kVec> xs, gys;
        float w[kVec];
        if constexpr (kHoldRow) {
          xs = held_x[k];
          gys = held_grad[k];
          widen(weight_packs[k], w);
        } else {
          read(slot, k, xs, gys, w);
        }
        const int64_t offset = row * columns + static_cast<int64_t>(k * kThreadsPerRow + t) * kVec;
        Pack<T, kVec> stored;
        if constexpr (kAddend) {
          const int4 bits = slot[(2 * kPacks + k) * kThreadsPerRow];
          Pack<T, kVec> extra;
          memcpy(&extra, &bits, 16);
          stored = gradient_pack_plus(xs, gys, w, gradient, extra);
        } else {
          stored = gradient_pack(xs, gys, w, gradient, static_cast<const T*>(nullptr));
        }
        store_pack(grad_x + offset, stored);
        if constexpr (kGradXSums) {
          // The rounded values, as the linear's own sums of its stored dY would add them.
#pragma unroll
          for (int j = 0; j < kVec; ++j) grad_x_sums[k][j] += stored.get(j);
        }
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  if constexpr (kThreadsPerRow > 32) {
    // Every group passes its named barrier as often as group 0, the one with the most rows (one
    // more barrier at most). The code needs no such balance: a group's barrier orders its own warps
    // only. But compute-sanitizer's racecheck, after groups have passed their named barriers
    // different numbers of times, reports the accesses that the __syncthreads() in
    // write_block_partials separates as hazards (tools/racecheck_barrier_probe.cu shows it on 60
    // lines; docs/reliability.md). Balanced, racecheck can check this kernel.
    const auto rows_from = [&](int64_t start) { return start < rows ? (rows - start + step - 1) / step : 0; };
    for (int64_t i = rows_from(first); i < rows_from(blockIdx.x); ++i) group_barrier<kThreadsPerRow, kGroups>(group);
  }
  wait_copies<0>();
  __syncthreads();  // the ring is reused as `merged` below
  if constexpr (kGradXSums) {
    write_block_partials<kVec, kPacks, kThreadsPerRow, true>(
        weight_sums, bias_sums, grad_x_sums, reinterpret_cast<float*>(ring),
        partials + static_cast<int64_t>(blockIdx.x) * kPartialSums * columns, group, kGroups, t, columns,
        kCentered && with_bias, true);
  } else {
    write_block_partials<kVec, kPacks, kThreadsPerRow>(
        weight_sums, bias_sums, bias_sums, reinterpret_cast<float*>(ring),
        partials + static_cast<int64_t>(blockIdx.x) * kPartialSums * columns, group, kGroups, t, columns,
        kCentered && with_bias, true);
  }
}

// Stage 1 for rows that do not move in packs (kVec 1: odd C, misaligned views): the same sums, with
// the row held in registers and no copy pipeline, kRegisterBackwardValues elements per thread.
// Dynamic shared memory: groups * 2 * columns floats (the groups' column sums at the end).
constexpr int kRegisterBackwardValues = 16;

__host__ __device__ constexpr int register_backward_block_threads(int threads_per_row) {
  return threads_per_row < 256 ? 256 : threads_per_row;
}

template <class T, int kThreadsPerRow, bool kCentered>
__global__ void __launch_bounds__(register_backward_block_threads(kThreadsPerRow))
    norm_backward_kernel(const T* __restrict__ x,           // [rows, columns]
                         const T* __restrict__ weight,      // [columns]
                         const float* __restrict__ mean,    // [rows] (layer norm only)
                         const float* __restrict__ rstd,    // [rows]
                         const T* __restrict__ grad_out,    // [rows, columns]
                         const T* __restrict__ grad_x_addend,  // [rows, columns] or null
                         T* __restrict__ grad_x,            // [rows, columns]
                         float* __restrict__ partials,      // [gridDim.x, 2, columns]
                         int64_t rows, int columns, bool with_bias) {
  constexpr int kPacks = kRegisterBackwardValues;
  constexpr int kGroups = register_backward_block_threads(kThreadsPerRow) / kThreadsPerRow;
  __shared__ float scratch[kGroupSumScratch<kThreadsPerRow, kGroups, 2>];
  extern __shared__ float merged[];  // [kGroups, 2, columns]
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int group = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int t = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const float inverse_columns = 1.0f / static_cast<float>(columns);
  int parity = 0;
  float weight_sums[kPacks][1], bias_sums[kPacks][1];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) weight_sums[k][0] = bias_sums[k][0] = 0.0f;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kGroups; base < rows;
       base += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t row = base + group;
    const bool row_valid = row < rows;
    const int64_t offset = row * columns;
    const float row_rstd = row_valid ? rstd[row] : 0.0f;
    const float shift = kCentered && row_valid ? -mean[row] * row_rstd : 0.0f;
    Pack<T, 1> xs[kPacks], gys[kPacks];
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = k * kThreadsPerRow + t;
      if (row_valid && column < columns) {
        xs[k] = load_pack<T, 1>(x + offset + column);
        gys[k] = load_pack<T, 1>(grad_out + offset + column);
        const float w[1] = {to_float(weight[column])};
        accumulate_pack<T, 1, kCentered>(xs[k], gys[k], w, row_rstd, shift, sums, weight_sums[k], bias_sums[k]);
      }
    }
    group_sum<kThreadsPerRow, kGroups>(sums, scratch, parity, group, t);
    if (!row_valid) continue;
    const RowGradient gradient = row_gradient(row_rstd, shift, sums, inverse_columns);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int column = k * kThreadsPerRow + t;
      if (column < columns) {
        const float w[1] = {to_float(weight[column])};
        store_pack(grad_x + offset + column,
                   gradient_pack(xs[k], gys[k], w, gradient, addend_at(grad_x_addend, offset + column)));
      }
    }
  }
  write_block_partials<1, kPacks, kThreadsPerRow>(weight_sums, bias_sums, bias_sums, merged,
                                                  partials + static_cast<int64_t>(blockIdx.x) * 2 * columns, group,
                                                  kGroups, t, columns, kCentered && with_bias, false);
}

// Fallback stage 1 for rows too long for registers: one block per row, two passes over the row; each
// thread adds its columns' sums straight into its block's partial row (columns are the thread's
// own, so no other thread touches them).
template <class T, int kVec, bool kCentered>
__global__ void __launch_bounds__(kStreamingThreads)
    norm_backward_streaming_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   const T* __restrict__ grad_out, const T* __restrict__ grad_x_addend,
                                   T* __restrict__ grad_x,
                                   float* __restrict__ partials, int64_t rows, int columns, bool with_bias) {
  __shared__ float scratch[32];
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
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
      float w[kVec];
      widen(load_pack<T, kVec>(weight + p * kVec), w);
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
      float w[kVec];
      widen(load_pack<T, kVec>(weight + p * kVec), w);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xhat = fmaf(xv.get(j), row_rstd, shift);
        block_partials[p * kVec + j] += gy.get(j) * xhat;
        if (bias_sums_needed) block_partials[columns + p * kVec + j] += gy.get(j);
      }
      store_pack(grad_x + offset + p * kVec,
                 gradient_pack(xv, gy, w, gradient, addend_at(grad_x_addend, offset + p * kVec)));
    }
  }
}

// Stage 2: grad_weight[c] = sum over blocks of partials[b][0][c] (grad_bias from [b][1][c], and
// grad_x's column sums from [b][2][c] with three partial rows a block; each where not null).
// A block covers 32 columns with 32 lanes of block indices each; the 32 slices are added in order.
// Launched as a programmatic dependent of stage 1 (launch_dependent), so it waits for stage 1's
// results first; it lets the next kernel start placing its blocks at once (it is short).
constexpr int kSumColumns = 32, kSumSlices = 32;

template <class T>
__global__ void __launch_bounds__(kSumColumns * kSumSlices)
    sum_partials_kernel(const float* __restrict__ partials,  // [blocks, partial_sums, columns]
                        int blocks, int partial_sums, int columns,
                        T* __restrict__ grad_weight,  // [columns]
                        T* __restrict__ grad_bias,    // [columns] or null
                        T* __restrict__ grad_x_sums,  // [columns] or null (partial_sums 3)
                        bool accumulate) {            // += into grad_weight and grad_bias

  allow_next_kernel_to_start();
  wait_for_previous_kernels();
  __shared__ float slices[kSumSlices][kSumColumns + 1];
  const int lane = static_cast<int>(threadIdx.x) % kSumColumns, slice = static_cast<int>(threadIdx.x) / kSumColumns;
  // Flat index over [partial_sums, columns]: which sum, then the column.
  const int index = static_cast<int>(blockIdx.x) * kSumColumns + lane;
  const int sum_index = index / columns, column = index % columns;
  T* const targets[3] = {grad_weight, grad_bias, grad_x_sums};
  const bool valid = index < partial_sums * columns && targets[sum_index] != nullptr;
  float total = 0.0f;
  if (valid) {
    for (int b = slice; b < blocks; b += kSumSlices) {
      total += partials[static_cast<int64_t>(b) * partial_sums * columns + index];
    }
  }
  slices[slice][lane] = total;
  __syncthreads();
  if (slice == 0 && valid) {
    float sum = 0.0f;
    for (int s = 0; s < kSumSlices; ++s) sum += slices[s][lane];
    T* target = targets[sum_index] + column;
    // grad_x's sums are written; the parameters' gradients accumulate where asked.
    *target = from_float<T>(accumulate && sum_index < 2 ? to_float(*target) + sum : sum);
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
    auto launch = [&]<int kPacks, int kThreadsPerRow>() {
      constexpr int kBlockThreads = forward_block_threads(kThreadsPerRow);
      launch_dependent(norm_forward_kernel<T, kVec, kPacks, kThreadsPerRow, kCentered, kResidual>,
                       grid_for(rows, kBlockThreads / kThreadsPerRow), kBlockThreads, 0, stream, in, res, w, b,
                       sum_data, data, mean_data, rstd_data, rows, columns, epsilon);
    };
    constexpr int kPacks = forward_packs(kVec);
    bool launched = false;
    if constexpr (kVec > 1) {
      // A warp per row when the row fits in 4 packs per lane (packed rows only: single elements
      // would leave a warp with too little to load at once).
      launched = dispatch_warp_packs(packs, [&]<int kLanePacks>() { launch.template operator()<kLanePacks, 32>(); });
    } else if (packs <= 32 * kPacks) {
      launch.template operator()<kPacks, 32>();
      launched = true;
    }
    if (!launched) {
      launched = dispatch_row_group(packs, kPacks, [&]<int kThreadsPerRow>() {
        launch.template operator()<kPacks, kThreadsPerRow>();
      });
    }
    if (!launched) {
      launch_dependent(norm_forward_streaming_kernel<T, kVec, kCentered, kResidual>, grid_for(rows, 1),
                       kStreamingThreads, 0, stream, in, res, w, b, sum_data, data, mean_data, rstd_data, rows,
                       columns, epsilon);
    }
  });
}

// The pipelined stage 1's configurations (measured on the H200, docs/performance.md): rows of up to
// 96 packs (C = 768 at bf16) take a warp per row holding up to 3 packs per lane, 10 rows per block;
// longer rows take groups of 64..512 threads holding 2 packs each, and rows of up to 2048 packs
// (C = 16384 at bf16) 512 threads holding 4. Past that, false (the streaming fallback).
// grad_x's column sums are taken in the pass by the warp rows only (the GPT-2 width: the residual
// stream's gradient there is the output projections' dY); wider rows would give up registers the
// kernel holds rows in.
constexpr int kPipelinedWarpPacks = 96;
constexpr int kPipelinedMaxPacks = 2048;

// Launches stage 1 when the rows fit the pipelined kernel (else false): blocks and partials (its
// partial rows) set for stage 2, partial_sums 3 where it also summed grad_x's columns (grad_x_sums
// asked and warp rows), else 2.
template <class T, int kVec, bool kCentered>
bool launch_norm_backward_pipelined(const T* in, const T* w, const float* mean_data, const float* rstd_data,
                                    const T* gy, const T* addend, T* gx, bool grad_x_sums, int64_t rows, int columns,
                                    bool with_bias, int device, cudaStream_t stream, Tensor& partials, int& blocks,
                                    int& partial_sums) {
  const int packs = columns / kVec;
  if (packs > kPipelinedMaxPacks) return false;
  auto launch = [&]<int kPacks, int kThreadsPerRow>() {
    constexpr int kGroups = pipeline_block_threads(kThreadsPerRow) / kThreadsPerRow;
    // A persistent grid of one block per SM (the launch bound and the shared memory allow no more),
    // so that there are few partial rows.
    blocks = static_cast<int>(std::min<int64_t>((rows + kGroups - 1) / kGroups, multiprocessor_count(device)));
    auto launch_with = [&]<bool kAddend, bool kGradXSums>() {
      constexpr auto kernel =
          norm_backward_pipelined_kernel<T, kVec, kPacks, kThreadsPerRow, kCentered, kAddend, kGradXSums>;
      partial_sums = kGradXSums ? 3 : 2;
      partials = Tensor::empty({blocks, partial_sums, columns}, kFloat32, Device::cuda(device));
      const size_t shared_bytes = pipeline_shared_bytes(kPacks, kThreadsPerRow, kAddend, columns, partial_sums);
      allow_dynamic_shared_memory<kernel>(shared_bytes, device);
      launch_dependent(kernel, blocks, pipeline_block_threads(kThreadsPerRow), shared_bytes, stream, in, w, mean_data,
                       rstd_data, gy, addend, gx, partials.data<float>(), rows, columns, with_bias);
    };
    auto launch_summing = [&]<bool kAddend>() {
      if constexpr (kThreadsPerRow == 32) {
        if (grad_x_sums) {
          launch_with.template operator()<kAddend, true>();
          return;
        }
      }
      launch_with.template operator()<kAddend, false>();
    };
    if (addend != nullptr) {
      launch_summing.template operator()<true>();
    } else {
      launch_summing.template operator()<false>();
    }
  };
  static_assert(pipeline_shared_bytes(4, 512, true, kPipelinedMaxPacks * 8, 2) <= 227 * 1024 &&
                    pipeline_shared_bytes(3, 32, true, kPipelinedWarpPacks * 8, 3) <= 227 * 1024,
                "the longest pipelined rows fit in an H100/H200 block's shared memory");
  if (packs <= 32) {
    launch.template operator()<1, 32>();
  } else if (packs <= 64) {
    launch.template operator()<2, 32>();
  } else if (packs <= kPipelinedWarpPacks) {
    launch.template operator()<3, 32>();
  } else if (!dispatch_row_group(packs, 2, [&]<int kThreadsPerRow>() { launch.template operator()<2, kThreadsPerRow>(); })) {
    launch.template operator()<4, 512>();
  }
  return true;
}

// Stage 2, launched as a programmatic dependent of stage 1 (see sum_partials_kernel). Rows of sums
// that are not asked for (grad_bias null, or two partial rows) take blocks that return at once.
template <class T>
void launch_sum_partials(const Tensor& partials, int blocks, int partial_sums, int columns, T* grad_weight,
                         T* grad_bias, T* grad_x_sums, bool accumulate, cudaStream_t stream) {
  const int used = grad_x_sums != nullptr ? 3 : grad_bias != nullptr ? 2 : 1;
  launch_dependent(sum_partials_kernel<T>, dim3((used * columns + kSumColumns - 1) / kSumColumns),
                   dim3(kSumColumns * kSumSlices), 0, stream, partials.data<float>(), blocks, partial_sums, columns,
                   grad_weight, grad_bias, grad_x_sums, accumulate);
}

// Stage 1 and stage 2. True when grad_x's column sums (extras.grad_x_column_sums) were written in
// them; false where the rows took a kernel that does not sum them, or none were asked.
template <class T, bool kCentered>
bool launch_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                          const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                          const Tensor& grad_bias, const NormBackwardExtras& extras, cudaStream_t stream) {
  const int columns = static_cast<int>(x.size(-1));
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  const int device = x.device().index;
  const bool with_bias = kCentered && grad_bias.defined();
  T* gw = grad_weight.data<T>();
  T* gb = with_bias ? grad_bias.data<T>() : nullptr;
  if (columns == 0) return false;
  if (rows == 0) {
    // Sums over no rows: grad_weight and grad_bias are zero (and accumulated, unchanged); grad_x's
    // column sums are left to the caller.
    if (extras.accumulate_parameter_gradients) return false;
    WEFT_CUDA_CHECK(cudaMemsetAsync(gw, 0, sizeof(T) * columns, stream));
    if (gb != nullptr) WEFT_CUDA_CHECK(cudaMemsetAsync(gb, 0, sizeof(T) * columns, stream));
    return false;
  }
  const T* in = x.data<T>();
  const T* w = weight.data<T>();
  const T* gy = grad_out.data<T>();
  T* gx = grad_x.data<T>();
  const T* addend = extras.grad_x_addend.defined() ? extras.grad_x_addend.data<T>() : nullptr;
  const float* mean_data = kCentered ? mean.data<float>() : nullptr;
  const float* rstd_data = rstd.data<float>();
  // cp.async copies the rows 16 bytes at a time.
  const bool packed = can_use_packs<T>(columns, in, w, gy, gx) && (addend == nullptr || is_aligned_16(addend));
  int blocks = 0, partial_sums = 2;
  Tensor partials;
  dispatch_pack<T>(packed, [&]<int kVec>() {
    if constexpr (kVec > 1) {
      if (launch_norm_backward_pipelined<T, kVec, kCentered>(in, w, mean_data, rstd_data, gy, addend, gx,
                                                             extras.grad_x_column_sums.defined(), rows, columns,
                                                             with_bias, device, stream, partials, blocks,
                                                             partial_sums)) {
        return;
      }
    } else {
      // Rows without packs: a group of 32, 128 or 512 threads holding up to 16 elements each.
      auto launch = [&]<int kThreadsPerRow>() {
        constexpr auto kernel = norm_backward_kernel<T, kThreadsPerRow, kCentered>;
        constexpr int kBlockThreads = register_backward_block_threads(kThreadsPerRow);
        constexpr int kGroups = kBlockThreads / kThreadsPerRow;
        const size_t shared_bytes = sizeof(float) * kGroups * 2 * columns;
        allow_dynamic_shared_memory<kernel>(shared_bytes, device);
        // A persistent grid: twice the SMs (the kernel is small), so that there are few partial rows.
        blocks = static_cast<int>(std::min<int64_t>((rows + kGroups - 1) / kGroups, 2 * multiprocessor_count(device)));
        partials = Tensor::empty({blocks, 2, columns}, kFloat32, x.device());
        launch_dependent(kernel, blocks, kBlockThreads, shared_bytes, stream, in, w, mean_data, rstd_data, gy, addend, gx,
                         partials.data<float>(), rows, columns, with_bias);
      };
      if (columns <= 32 * kRegisterBackwardValues) {
        launch.template operator()<32>();
        return;
      }
      if (columns <= 128 * kRegisterBackwardValues) {
        launch.template operator()<128>();
        return;
      }
      if (columns <= 512 * kRegisterBackwardValues) {
        launch.template operator()<512>();
        return;
      }
    }
    blocks = static_cast<int>(std::min<int64_t>(rows, 2 * multiprocessor_count(device)));
    partials = Tensor::empty({blocks, 2, columns}, kFloat32, x.device());
    launch_dependent(norm_backward_streaming_kernel<T, kVec, kCentered>, blocks, kStreamingThreads, 0, stream, in, w,
                     mean_data, rstd_data, gy, addend, gx, partials.data<float>(), rows, columns, with_bias);
  });
  T* grad_x_sums = partial_sums == 3 ? extras.grad_x_column_sums.data<T>() : nullptr;
  launch_sum_partials<T>(partials, blocks, partial_sums, columns, gw, gb, grad_x_sums,
                         extras.accumulate_parameter_gradients, stream);
  return grad_x_sums != nullptr;
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
                                      const Tensor& grad_bias, const NormBackwardExtras& extras) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  bool summed = false;
  cuda::dispatch_cuda_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    summed = cuda::launch_norm_backward<T, true>(x, weight, mean, rstd, grad_out, grad_x, grad_weight, grad_bias,
                                                 extras, stream);
  });
  // Where the kernels did not sum grad_x's columns: a pass of its own (what the linear would have run).
  if (extras.grad_x_column_sums.defined() && !summed) {
    sum_over_rows(grad_x.view({-1, x.size(-1)}), extras.grad_x_column_sums);
  }
}

// Where the pipelined kernel's warp rows take x's rows (see kPipelinedWarpPacks).
bool CudaBackend::norm_backward_sums_columns_in_pass(const Tensor& x) const {
  const int64_t columns = x.size(-1);
  const int64_t pack = 16 / static_cast<int64_t>(dtype_size(x.dtype()));
  return x.device().is_cuda() && x.is_contiguous() && columns > 0 && columns % pack == 0 &&
         columns / pack <= cuda::kPipelinedWarpPacks && cuda::is_aligned_16(x.raw_data());
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

void CudaBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                               const Tensor& sum_out, const Tensor& out, const Tensor& rstd) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_floating(x.dtype(), "add_rms_norm", [&]<class T>() {
    cuda::launch_norm_forward<T, false, true>(x, residual, weight, Tensor(), eps, sum_out, out, Tensor(), rstd,
                                              stream);
  });
}

void CudaBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& grad_out,
                                    const Tensor& grad_x, const Tensor& grad_weight,
                                    const NormBackwardExtras& extras) {
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  bool summed = false;
  cuda::dispatch_cuda_floating(x.dtype(), "rms_norm_backward", [&]<class T>() {
    summed = cuda::launch_norm_backward<T, false>(x, weight, Tensor(), rstd, grad_out, grad_x, grad_weight, Tensor(),
                                                  extras, stream);
  });
  // Where the kernels did not sum grad_x's columns: a pass of its own (what the linear would have run).
  if (extras.grad_x_column_sums.defined() && !summed) {
    sum_over_rows(grad_x.view({-1, x.size(-1)}), extras.grad_x_column_sums);
  }
}

}  // namespace weft
