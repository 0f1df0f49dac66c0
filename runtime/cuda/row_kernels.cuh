// Building blocks of the CUDA row kernels (softmax, layer/RMS norm, embedding, cross-entropy, dropout).
//
// These kernels are memory-bound, so they move data in 16-byte packs (one LDG.128/STG.128 per thread:
// 8 bf16/f16 or 4 f32 elements) and keep every intermediate in registers. A pack path needs every
// base pointer 16-byte aligned and the row length a multiple of the pack size; otherwise the same
// kernel template runs with packs of one element (odd sizes such as C = 37, or views at odd offsets).
//
// Row reductions: a row is handled by a warp (shuffles only, no barrier) or by several warps of one
// block (shuffles, then a fixed-order sum over the warps through shared memory), so every result is
// the same from run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"

namespace weft::cuda {

// Elements of T in one 16-byte pack.
template <class T>
inline constexpr int kPackSize = static_cast<int>(16 / sizeof(T));

// kCount consecutive elements loaded or stored together (16 bytes when kCount == kPackSize<T>).
template <class T, int kCount>
struct alignas(sizeof(T) * kCount) Pack {
  T values[kCount];
  __device__ __forceinline__ float get(int i) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16> && kCount % 2 == 0) {
      // A bf16 is the upper half of the f32 it widens to, so an element pair's word gives the even
      // element by a shift and the odd one by a mask: one instruction each, where extracting the
      // half first costs two (the norm backward is instruction-bound enough for this to show).
      uint32_t word;
      memcpy(&word, &values[i - i % 2], sizeof(word));
      return __uint_as_float(i % 2 == 0 ? word << 16 : word & 0xffff0000u);
    } else {
      return to_float(values[i]);
    }
  }
  __device__ __forceinline__ void set(int i, float value) { values[i] = from_float<T>(value); }
};

// Plain load: the data may be read again soon (it stays in L1/L2).
template <class T, int kCount>
__device__ __forceinline__ Pack<T, kCount> load_pack(const T* address) {
  Pack<T, kCount> pack;
  if constexpr (sizeof(pack) == 16) {
    const int4 bits = *reinterpret_cast<const int4*>(address);
    memcpy(&pack, &bits, 16);
  } else {
    pack = *reinterpret_cast<const Pack<T, kCount>*>(address);
  }
  return pack;
}

// Streaming load (evict-first): data read exactly once, so it does not push reusable lines out of L2.
template <class T, int kCount>
__device__ __forceinline__ Pack<T, kCount> load_pack_streaming(const T* address) {
  Pack<T, kCount> pack;
  if constexpr (sizeof(pack) == 16) {
    const int4 bits = __ldcs(reinterpret_cast<const int4*>(address));
    memcpy(&pack, &bits, 16);
  } else {
    pack = *reinterpret_cast<const Pack<T, kCount>*>(address);
  }
  return pack;
}

// Read-only (non-coherent) load that bypasses L1 and asks L2 to fetch the whole 256-byte sector
// group: for rows that a kernel reads once (the norm, softmax and cross-entropy inputs). Only where no
// thread of the kernel reads an address after the kernel has written it: an in-place call (out == x)
// writes each element after the same thread has read it, which is allowed. Measured on the H200
// (docs/performance.md): a few points of bandwidth over a plain load for the norm kernels.
template <class T, int kCount>
__device__ __forceinline__ Pack<T, kCount> load_pack_once(const T* address) {
  Pack<T, kCount> pack;
  if constexpr (sizeof(pack) == 16) {
    int4 bits;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(bits.x), "=r"(bits.y), "=r"(bits.z), "=r"(bits.w)
        : "l"(address));
    memcpy(&pack, &bits, 16);
  } else {
    pack = *reinterpret_cast<const Pack<T, kCount>*>(address);
  }
  return pack;
}

template <class T, int kCount>
__device__ __forceinline__ void store_pack(T* address, const Pack<T, kCount>& pack) {
  if constexpr (sizeof(pack) == 16) {
    int4 bits;
    memcpy(&bits, &pack, 16);
    *reinterpret_cast<int4*>(address) = bits;
  } else {
    *reinterpret_cast<Pack<T, kCount>*>(address) = pack;
  }
}

// Streaming store: large outputs that the next kernel reads from memory anyway.
template <class T, int kCount>
__device__ __forceinline__ void store_pack_streaming(T* address, const Pack<T, kCount>& pack) {
  if constexpr (sizeof(pack) == 16) {
    int4 bits;
    memcpy(&bits, &pack, 16);
    __stcs(reinterpret_cast<int4*>(address), bits);
  } else {
    *reinterpret_cast<Pack<T, kCount>*>(address) = pack;
  }
}

// exp(value - maximum) for softmax-like kernels: the hardware's approximate exp2 (one MUFU.EX2;
// relative error about 2^-22) of (value - maximum) * log2(e). The subtraction comes first and is
// exact or nearly so, so the error does not grow with the logits' magnitude. expf costs about ten
// instructions per element, which made the softmax and cross-entropy forward kernels issue-bound
// (measured on the H200: 62% -> 75% and 71% -> 95% of copy bandwidth). exp(-inf) is 0; a NaN stays NaN.
__device__ __forceinline__ float exp_shifted(float value, float maximum) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"((value - maximum) * 1.4426950408889634f));
  return result;
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// warp_sum of two values in 6 shuffles instead of 10: at the first level each lane sends its
// partner the value the partner keeps, so that lanes 0-15 go on with the first value and lanes 16-31
// with the second; the halves then swap their totals. The additions are warp_sum's, in warp_sum's
// order, so the results are the same bits on every lane and equal to two warp_sum calls.
__device__ __forceinline__ void warp_sum_pair(float (&values)[2]) {
  const bool upper = (threadIdx.x & 16) != 0;
  float kept = upper ? values[1] : values[0];
  kept += __shfl_xor_sync(0xffffffffu, upper ? values[0] : values[1], 16);
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) kept += __shfl_xor_sync(0xffffffffu, kept, offset);
  const float other = __shfl_xor_sync(0xffffffffu, kept, 16);
  values[0] = upper ? other : kept;
  values[1] = upper ? kept : other;
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// bar.sync on barrier 1 + group for kThreads threads, with the id written into the instruction:
// a kernel whose barrier ids are registers reserves all 16 of the SM's barriers per block, which
// caps it at 4 resident blocks per SM (ncu: "Block Limit Barriers"); immediate ids 1..kGroups
// reserve only those.
template <int kThreads, int kGroups, int kId = 1>
__device__ __forceinline__ void group_barrier(int group) {
  static_assert(kGroups <= 15, "named barriers 1..15");
  if (group == kId - 1) {
    asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
  } else if constexpr (kId < kGroups) {
    group_barrier<kThreads, kGroups, kId + 1>(group);
  }
}

// Sums kCount values over a row group of kThreadsPerRow threads (consecutive warps; `group` is
// threadIdx.x / kThreadsPerRow, `t` the thread's index in it): shuffles, and for several warps a
// fixed-order sum over the warps through shared memory behind the group's own named barrier, so
// that the other groups of the block do not wait and results do not vary between runs. `scratch`
// holds 2 * kGroups * (kThreadsPerRow / 32) * kCount floats; its halves alternate between calls
// (`parity`, 0 at the first call), so one barrier per call suffices: a warp can rewrite a half only
// after every warp of its group has passed the barrier of the call in between, that is, finished
// reading it. All threads of the group must call.
template <int kThreadsPerRow, int kGroups, int kCount>
__device__ __forceinline__ void group_sum(float (&values)[kCount], float* scratch, int& parity, int group, int t) {
  static_assert(kThreadsPerRow % 32 == 0, "row groups are whole warps");
  if constexpr (kCount == 2) {
    warp_sum_pair(values);
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i) values[i] = warp_sum(values[i]);
  }
  if constexpr (kThreadsPerRow > 32) {
    constexpr int kWarps = kThreadsPerRow / 32;
    float* half = scratch + ((parity * kGroups + group) * kWarps) * kCount;
    if (t % 32 == 0) {
#pragma unroll
      for (int i = 0; i < kCount; ++i) half[(t / 32) * kCount + i] = values[i];
    }
    group_barrier<kThreadsPerRow, kGroups>(group);
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += half[w * kCount + i];
      values[i] = total;
    }
    parity ^= 1;
  }
}

// Shared-memory floats that group_sum needs for kCount values.
template <int kThreadsPerRow, int kGroups, int kCount>
inline constexpr int kGroupSumScratch = kThreadsPerRow > 32 ? 2 * kGroups * (kThreadsPerRow / 32) * kCount : 1;

// A running (maximum, sum of exp(x - maximum)) over part of a row: the online softmax state.
struct MaxSum {
  float maximum;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float maximum = fmaxf(a.maximum, b.maximum);
  if (maximum == -INFINITY) return {maximum, 0.0f};  // both empty (or all -inf): avoid -inf - -inf
  return {maximum, a.sum * expf(a.maximum - maximum) + b.sum * expf(b.maximum - maximum)};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum state) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, state.maximum, offset),
                       __shfl_xor_sync(0xffffffffu, state.sum, offset)};
    state = merge(state, other);
  }
  return state;
}

// Merges every thread's state over the whole block; all threads get the result. `scratch` holds
// 2 * 32 floats of shared memory.
__device__ __forceinline__ MaxSum block_merge(MaxSum state, float* scratch) {
  state = warp_merge(state);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) {
    scratch[warp] = state.maximum;
    scratch[32 + warp] = state.sum;
  }
  __syncthreads();
  state = lane < warps ? MaxSum{scratch[lane], scratch[32 + lane]} : MaxSum{-INFINITY, 0.0f};
  return warp_merge(state);
}

// Block-wide sum of one value; all threads get it. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float value, float* scratch) {
  value = warp_sum(value);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  return warp_sum(lane < warps ? scratch[lane] : 0.0f);
}

// Block-wide maximum of one value; all threads get it. `scratch` holds 32 floats of shared memory
// (it may be the same scratch as block_sum's: each call synchronizes before writing).
__device__ __forceinline__ float block_max(float value, float* scratch) {
  value = warp_max(value);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

// --- Host side ---------------------------------------------------------------------------------

inline bool is_aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// True when rows of `columns` elements of T can move in 16-byte packs: the row length is a multiple
// of the pack size and every base pointer is 16-byte aligned.
template <class T, class... Pointers>
bool can_use_packs(int64_t columns, const Pointers*... pointers) {
  return columns % kPackSize<T> == 0 && (is_aligned_16(pointers) && ...);
}

// Calls body.template operator()<kVec>() with kVec = kPackSize<T> when `packed`, else 1.
template <class T, class Body>
void dispatch_pack(bool packed, Body&& body) {
  if (packed) {
    body.template operator()<kPackSize<T>>();
  } else {
    body.template operator()<1>();
  }
}

// Streaming multiprocessors of `device` (cached: the attribute query is a driver call).
inline int multiprocessor_count(int device) {
  static int counts[64] = {};
  if (device < 0 || device >= 64) return 132;
  if (counts[device] == 0) {
    int count = 0;
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    counts[device] = count;
  }
  return counts[device];
}

}  // namespace weft::cuda
