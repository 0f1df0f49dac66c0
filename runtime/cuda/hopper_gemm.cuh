// A bf16 matrix product for Hopper (sm_90a) with its epilogue fused: D = A · Bᵀ (+ bias) (then GELU,
// the tanh form, with the pre-activation kept for backward), f32 accumulation. It exists because
// cuBLASLt's epilogue kernels for GELU run well below its plain ones (docs/performance.md,
// 2026-12-03/04: the GPT-2 up-projection with bias + GELU_AUX at 72% of the plain product's pace):
// writing two outputs from a tile is half the tile's time when nothing overlaps it.
//
// Shapes (row-major, leading dimension = the row's length):
//   a        [M, K] bf16, K contiguous (the activations)
//   b        [N, K] bf16, K contiguous (a linear layer's weight, out × in)
//   bias     [N] bf16 or null
//   out      [M, N] bf16                      = epilogue(a · bᵀ + bias)
//   pre_gelu [M, N] bf16 or null              = a · bᵀ + bias, for kBiasGelu only
// Invariants: K a multiple of 8 and N even (TMA's 16-byte row strides; bf16 pairs in the epilogue);
// M, N, K otherwise free: TMA fills tiles past the edges with zeros and the epilogue writes only
// inside [M, N]. Everything 16-byte aligned.
//
// How it runs: a CTA computes a 128 × 128 tile of D. One producer warp issues TMA loads of 64-wide K
// slices of A and B (128-byte swizzle, the layout wgmma reads) into a ring of three stages, each
// guarded by a "full" mbarrier (the bytes have landed) and an "empty" one (the consumers are done
// with it). One consumer warpgroup runs wgmma m64n128k16 on each slice for the tile's two 64-row
// halves, keeps one slice's products in flight, and applies the epilogue from registers. Two CTAs
// fit an SM (97 KiB of shared memory, 160 threads each), so one CTA's epilogue runs under the other's
// products: that is the overlap cuBLASLt's GELU kernels lack.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::cuda::hopper {

constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 64, kStages = 3;
constexpr int kConsumerThreads = 128;                  // one warpgroup
constexpr int kThreads = kConsumerThreads + 32;       // and one producer warp
constexpr int kATileBytes = kBlockM * kBlockK * 2;     // [128, 64] bf16
constexpr int kBTileBytes = kBlockN * kBlockK * 2;     // [128, 64] bf16
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kSharedBytes = kStages * kStageBytes + 1024 + 2 * kStages * 8;  // + alignment + barriers

enum class Epilogue { kNone, kBias, kBiasGelu };

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WEFT_HOPPER_GEMM_DEVICE 1
#endif

#ifdef WEFT_HOPPER_GEMM_DEVICE
namespace device {

__device__ inline uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ inline void barrier_init(uint64_t* barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(count));
}

__device__ inline void barrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

__device__ inline void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// Waits until the barrier's phase of this parity has completed.
__device__ inline void barrier_wait(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}

// A [box rows, 64] slice at (column, row) of the map's matrix into shared memory, counted on barrier.
__device__ inline void tma_load(void* destination, const CUtensorMap* map, uint64_t* barrier, int column, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(barrier)), "r"(column), "r"(row)
      : "memory");
}

// wgmma's shared-memory operand: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ inline uint64_t operand_descriptor(const void* tile) {
  uint64_t descriptor = (shared_address(tile) & 0x3FFFF) >> 4;
  descriptor |= uint64_t{1} << 16;           // leading byte offset: unused with a 128-byte swizzle
  descriptor |= uint64_t{1024 >> 4} << 32;   // stride byte offset: one 8-row group
  descriptor |= uint64_t{1} << 62;           // swizzle mode: 128 bytes
  return descriptor;
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kInFlight>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kInFlight) : "memory");
}

// Keeps the compiler from moving reads of the accumulators across a wgmma wait.
__device__ inline void fence_registers(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d[64 × 128] += a[64 × 16] · b[128 × 16]ᵀ, both from shared memory.
__device__ inline void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}

// GELU, the tanh form (as cuBLASLt's GELU epilogue and weft's UnaryOp::kGelu).
__device__ inline float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(inner));
}

}  // namespace device
#endif  // WEFT_HOPPER_GEMM_DEVICE

// a [M, K] · b [N, K]ᵀ → out [M, N] with kEpilogue; a_map and b_map are TMA maps of a and b with
// boxes of [128 rows, 64 columns] and a 128-byte swizzle (make_operand_map in hopper_gemm.cu).
template <Epilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map, int m_size,
                int n_size, int k_size, const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ out,
                __nv_bfloat16* __restrict__ pre_gelu) {
#ifdef WEFT_HOPPER_GEMM_DEVICE
  using namespace device;
  extern __shared__ uint8_t shared_raw[];
  // The 128-byte swizzle repeats every 1024 bytes, and wgmma's descriptors assume tiles aligned to it.
  uint8_t* shared = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * kStageBytes);  // [kStages]
  uint64_t* empty = full + kStages;                                                // [kStages]
  const int m_start = blockIdx.y * kBlockM, n_start = blockIdx.x * kBlockN;
  const int k_blocks = (k_size + kBlockK - 1) / kBlockK;

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      barrier_init(&full[stage], 1);   // the producer's expect_tx; the bytes complete it
      barrier_init(&empty[stage], 4);  // one arrival from each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= kConsumerThreads) {  // the producer warp: one lane issues every load
    if (threadIdx.x == kConsumerThreads) {
      for (int k_block = 0; k_block < k_blocks; ++k_block) {
        const int stage = k_block % kStages;
        if (k_block >= kStages) barrier_wait(&empty[stage], ((k_block / kStages) - 1) & 1);
        uint8_t* a_tile = shared + stage * kStageBytes;
        barrier_expect_bytes(&full[stage], kStageBytes);
        tma_load(a_tile, &a_map, &full[stage], k_block * kBlockK, m_start);
        tma_load(a_tile + kATileBytes, &b_map, &full[stage], k_block * kBlockK, n_start);
      }
    }
    return;
  }

  float accumulators[2][64];  // the tile's two 64-row halves, in wgmma's fragment layout
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int i = 0; i < 64; ++i) accumulators[half][i] = 0.f;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k_block = 0; k_block < k_blocks; ++k_block) {
    const int stage = k_block % kStages;
    barrier_wait(&full[stage], (k_block / kStages) & 1);
    const uint8_t* a_tile = shared + stage * kStageBytes;
    const uint64_t a_top = operand_descriptor(a_tile), a_bottom = operand_descriptor(a_tile + kATileBytes / 2);
    const uint64_t b_all = operand_descriptor(a_tile + kATileBytes);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockK / 16; ++k) {
      // 16 columns of bf16 are 32 bytes along the swizzled row: 2 in the descriptor's address field.
      wgmma_m64n128k16(accumulators[0], a_top + 2 * k, b_all + 2 * k);
      wgmma_m64n128k16(accumulators[1], a_bottom + 2 * k, b_all + 2 * k);
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous slice's products are done: its stage may be loaded again
    if (k_block > 0 && lane == 0) barrier_arrive(&empty[(k_block - 1) % kStages]);
  }
  wgmma_wait<0>();
  fence_registers(accumulators[0]);
  fence_registers(accumulators[1]);

  // Fragment layout of m64nNk16's f32 accumulators: value 4c + r of a thread sits at row
  // 16·warp + lane/4 + 8·(r/2) and column 8c + 2·(lane%4) + r%2 of the 64-row half.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const int row = m_start + 64 * half + 16 * warp + lane / 4 + 8 * pair;
      if (row >= m_size) continue;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c) {
        const int column = n_start + 8 * c + 2 * (lane % 4);
        if (column >= n_size) continue;
        float first = accumulators[half][4 * c + 2 * pair], second = accumulators[half][4 * c + 2 * pair + 1];
        if constexpr (kEpilogue != Epilogue::kNone) {
          const __nv_bfloat162 bias_pair = *reinterpret_cast<const __nv_bfloat162*>(bias + column);
          first += __bfloat162float(bias_pair.x);
          second += __bfloat162float(bias_pair.y);
        }
        const size_t offset = static_cast<size_t>(row) * n_size + column;
        if constexpr (kEpilogue == Epilogue::kBiasGelu) {
          if (pre_gelu != nullptr) {
            *reinterpret_cast<__nv_bfloat162*>(pre_gelu + offset) = __floats2bfloat162_rn(first, second);
          }
          first = gelu_tanh(first);
          second = gelu_tanh(second);
        }
        *reinterpret_cast<__nv_bfloat162*>(out + offset) = __floats2bfloat162_rn(first, second);
      }
    }
  }
#endif  // WEFT_HOPPER_GEMM_DEVICE
}

}  // namespace weft::cuda::hopper
