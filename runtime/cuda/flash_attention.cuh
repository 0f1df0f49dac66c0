// Causal flash attention on tensor cores (bf16 / f16), forward and backward, plus a simple f32 path
// (no tensor cores). Never writes T x T scores.
//
// Layout: q, o, dO, dq are [BH, T, D] contiguous (BH = batch * heads) and k, v, dk, dv are
// [BKV, T, D] (BKV = batch * kv heads, grouped-query attention: `group` = H / KV query heads share a
// kv head, and query head row bh reads kv head row bh / group, which is b * KV + h / group); lse,
// delta are [BH, T] f32. Causal: query t attends keys 0..t. lse is the natural log-sum-exp of each
// scaled, masked score row (the contract of runtime/backend.h).
//
// Head dims. The tensor-core kernels are instantiated for the tile widths of kFlashWidths (64 and
// 128, GPT-2's, exactly as before; 32, 96, 192, 256 for the others); the caller (attention.cu)
// zero-pads any other head dim 1..256 to the next width, which changes no dot product and leaves
// zero columns in O, dQ, dK, dV. Widths above 128 keep Q in shared memory rather than registers
// and their backward spills accumulators (correct, not fast: cuDNN is the fast path there). The
// f32 kernels take any head dim <= 256 (lanes hold 4 or 8 columns; kSimpleMaxDim).
//
// Tensor-core kernels (FlashAttention-2 style, mma.sync.m16n8k16 with f32 accumulation):
// - Blocks of kBlock = 64 query rows and 64 key rows, 4 warps (128 threads); each warp owns 16 rows.
//   Shared-memory tiles are row-major with rows padded by 8 elements (16 bytes), so ldmatrix's
//   8 row addresses fall in distinct banks. Tiles are loaded with cp.async (16 B per thread and
//   instruction, coalesced); rows past T are zero-filled.
// - Forward: one block per (query block, head), heaviest (last) query blocks first. Q fragments
//   stay in registers; K/V tiles are double-buffered; online softmax in the exp2 domain; O is
//   accumulated in f32 registers and normalised at the end.
// - Backward: delta = rowsum(dO * O) by a small kernel; then one block per (key block, kv head)
//   iterates, for each query head of the kv head's group, the query blocks at or after its diagonal
//   (so dK and dV of a shared kv head are summed in registers, no atomics and no scratch). Each warp owns 16 keys and keeps their dK
//   and dV in f32 registers; it computes S^T = K Q^T and dP^T = V dO^T, P^T from the saved lse,
//   dS^T = P^T (dP^T - delta) * scale; dV += P^T dO and dK += dS^T Q. dS^T goes through shared
//   memory so that each warp then computes 16 query rows of dQ = dS K (in column chunks of 64, or
//   32 when D is no multiple of 64), added with f32 atomics to an f32 scratch [BH, T, D]; a last
//   kernel rounds it to the output dtype. The atomics add in whatever order the key blocks come,
//   so dQ's last bits vary from run to run; under deterministic kernels (runtime/determinism.h)
//   each key block stores its share into a slice of its own ([T / 64 key blocks][BH, T, D], f32:
//   T / 64 copies of dQ's size), and the last kernel sums a row's slices 0..(its block) in order.
//
// Fragment conventions of mma.m16n8k16 (row.col), lane = threadIdx.x % 32, g = lane / 4,
// c = lane % 4:  A (16x16): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..);
// B (16x8, k x n): b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g); C (16x8 f32): c0,c1 (g, 2c..2c+1),
// c2,c3 (g+8, 2c..2c+1). A C tile pair (n8 tiles 2j, 2j+1) repacked to 16-bit is the A fragment of
// k-chunk j (the FlashAttention-2 register reuse).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/dynamic_shared_memory.cuh"

namespace weft::cuda::flash {

constexpr int kBlock = 64;    // query rows and key rows per tile
constexpr int kThreads = 128; // 4 warps
constexpr int kPad = 8;       // elements of padding per shared-memory row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kFlashWidths[] = {32, 64, 96, 128, 192, 256};  // tile widths the kernels are built for
constexpr int kFlashMaxDim = 256;

// The smallest tile width >= head_dim (head_dim in 1..kFlashMaxDim).
constexpr int flash_width_for(int head_dim) {
  for (int width : kFlashWidths) {
    if (head_dim <= width) return width;
  }
  return 0;
}

// --- PTX wrappers -----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, asynchronous; src_bytes 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// c += a * b on tensor cores, f32 accumulation.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to the 16-bit type, packed (lo in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Loads rows [row0, row0 + 64) of a [T, D] matrix into a padded [64][D + kPad] tile; rows >= seq
// become zeros. Called by all 128 threads.
template <class T, int D>
__device__ __forceinline__ void load_tile(T* tile, const T* __restrict__ source, int row0, int seq, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kStride = D + kPad;
#pragma unroll
  for (int i = 0; i < kBlock * kChunks / kThreads; ++i) {
    const int index = tid + i * kThreads;
    const int row = index / kChunks, chunk = index % kChunks;
    const int global_row = row0 + row;
    const bool inside = global_row < seq;
    const T* src = source + static_cast<int64_t>(inside ? global_row : 0) * D + chunk * 8;
    cp_async_16(smem_address(tile + row * kStride + chunk * 8), src, inside ? 16 : 0);
  }
}

// A fragment (16 rows x 16 cols at (row0, col0)) of a row-major [m][k] tile.
__device__ __forceinline__ uint32_t a_address(const void* tile, int stride, int row0, int col0, int lane,
                                              int element_size) {
  const int row = row0 + (lane % 16), col = col0 + (lane / 16) * 8;
  return smem_address(static_cast<const char*>(tile) + (row * stride + col) * element_size);
}
// Two B fragments (n8 tiles n0 and n0 + 8, k 16 at k0) of a tile stored [n][k] (ldmatrix_x4).
__device__ __forceinline__ uint32_t b_nk_address(const void* tile, int stride, int n0, int k0, int lane,
                                                 int element_size) {
  const int group = lane / 8, r = lane % 8;
  const int row = n0 + r + (group / 2) * 8, col = k0 + (group % 2) * 8;
  return smem_address(static_cast<const char*>(tile) + (row * stride + col) * element_size);
}
// Two B fragments (n8 tiles n0 and n0 + 8, k 16 at k0) of a tile stored [k][n] (ldmatrix_x4_trans).
__device__ __forceinline__ uint32_t b_kn_address(const void* tile, int stride, int k0, int n0, int lane,
                                                 int element_size) {
  const int group = lane / 8, r = lane % 8;
  const int row = k0 + r + (group % 2) * 8, col = n0 + (group / 2) * 8;
  return smem_address(static_cast<const char*>(tile) + (row * stride + col) * element_size);
}
// A fragment (m 16 at m0, k 16 at k0) of a tile stored transposed, [k][m] (ldmatrix_x4_trans).
__device__ __forceinline__ uint32_t a_km_address(const void* tile, int stride, int m0, int k0, int lane,
                                                 int element_size) {
  const int group = lane / 8, r = lane % 8;
  const int row = k0 + r + (group / 2) * 8, col = m0 + (group % 2) * 8;
  return smem_address(static_cast<const char*>(tile) + (row * stride + col) * element_size);
}

// --- Forward ----------------------------------------------------------------------------------

template <int D>
constexpr int forward_smem_bytes() {
  return (kBlock * (D + kPad)) * 5 * 2;  // Q, K[2], V[2], 16-bit elements
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ o, float* __restrict__ lse, int seq, int group, float scale_log2) {
  static_assert(D % 16 == 0 && D <= kFlashMaxDim);
  // Up to 128 columns Q's fragments stay in registers; wider, they are read from shared memory at
  // each key block (registers then hold the larger O accumulator).
  constexpr bool kQInRegisters = D <= 128;
  constexpr int kQFragments = kQInRegisters ? D / 16 : 1;
  constexpr int kStride = D + kPad;
  constexpr int kTile = kBlock * kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_k = s_q + kTile;      // two stages
  T* s_v = s_k + 2 * kTile;  // two stages

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest blocks first
  const int64_t head = static_cast<int64_t>(blockIdx.y) * seq * D;
  const int64_t kv_head = static_cast<int64_t>(blockIdx.y / group) * seq * D;
  const T* qh = q + head;
  const T* kh = k + kv_head;
  const T* vh = v + kv_head;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n_blocks = m_block + 1;  // key blocks 0..m_block (equal block sizes)

  load_tile<T, D>(s_q, qh, m_block * kBlock, seq, tid);
  load_tile<T, D>(s_k, kh, 0, seq, tid);
  load_tile<T, D>(s_v, vh, 0, seq, tid);
  cp_async_commit();

  uint32_t q_frag[kQFragments][4];
  float o_acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // this thread's partial sums (reduced over the quad at the end)
  const int query_row[2] = {m_block * kBlock + warp * 16 + lane / 4, m_block * kBlock + warp * 16 + lane / 4 + 8};

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_blocks) {
      load_tile<T, D>(s_k + (stage ^ 1) * kTile, kh, (j + 1) * kBlock, seq, tid);
      load_tile<T, D>(s_v + (stage ^ 1) * kTile, vh, (j + 1) * kBlock, seq, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    if constexpr (kQInRegisters) {
      if (j == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          ldmatrix_x4(q_frag[kk], a_address(s_q, kStride, warp * 16, kk * 16, lane, sizeof(T)));
        }
      }
    }
    const T* k_tile = s_k + stage * kTile;
    const T* v_tile = s_v + stage * kTile;

    // S = Q K^T for this warp's 16 rows and the 64 keys.
    float s[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int fragment = kQInRegisters ? kk : 0;
      if constexpr (!kQInRegisters) {
        ldmatrix_x4(q_frag[0], a_address(s_q, kStride, warp * 16, kk * 16, lane, sizeof(T)));
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, b_nk_address(k_tile, kStride, np * 16, kk * 16, lane, sizeof(T)));
        mma_16816<T>(s[2 * np], q_frag[fragment], b[0], b[1]);
        mma_16816<T>(s[2 * np + 1], q_frag[fragment], b[2], b[3]);
      }
    }

    // Scale (log2 domain) and the causal mask on the diagonal block.
    const bool diagonal = j == m_block;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float value = s[nt][e] * scale_log2;
        if (diagonal) {
          const int key = j * kBlock + nt * 8 + 2 * (lane % 4) + (e & 1);
          if (key > query_row[e >> 1]) value = -INFINITY;
        }
        s[nt][e] = value;
      }
    }

    // Online softmax: new running max, rescale the accumulator, P = exp2(S - max).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float block_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) block_max = fmaxf(block_max, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      const float new_max = fmaxf(row_max[h], block_max);
      const float base = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing unmasked yet
      const float correction = exp2f(row_max[h] - base);        // exp2(-inf) = 0 on the first block
      row_max[h] = new_max;
      float partial = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
        partial += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      row_sum[h] = row_sum[h] * correction + partial;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o_acc[dt][2 * h] *= correction;
        o_acc[dt][2 * h + 1] *= correction;
      }
    }

    // O += P V: P (16 x 64) from registers as four k-chunks of A fragments.
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      uint32_t p_frag[4];
      p_frag[0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
      p_frag[1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
      p_frag[2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      p_frag[3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, b_kn_address(v_tile, kStride, kc * 16, dp * 16, lane, sizeof(T)));
        mma_16816<T>(o_acc[2 * dp], p_frag, b[0], b[1]);
        mma_16816<T>(o_acc[2 * dp + 1], p_frag, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Normalise and write O and lse.
  T* oh = o + head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float total = row_sum[h];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const float inverse = 1.f / total;
    const int row = query_row[h];
    if (row < seq) {
      T* out_row = oh + static_cast<int64_t>(row) * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const uint32_t packed = pack2<T>(o_acc[dt][2 * h] * inverse, o_acc[dt][2 * h + 1] * inverse);
        *reinterpret_cast<uint32_t*>(out_row + dt * 8 + 2 * (lane % 4)) = packed;
      }
      if (lane % 4 == 0) lse[static_cast<int64_t>(blockIdx.y) * seq + row] = row_max[h] * kLn2 + logf(total);
    }
  }
}

// --- Backward ---------------------------------------------------------------------------------

// delta[r] = sum_d dO[r, d] * O[r, d] in f32; one warp per row.
template <class T>
__global__ void attention_delta_kernel(const T* __restrict__ out, const T* __restrict__ grad_out,
                                       float* __restrict__ delta, int64_t rows, int head_dim) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows;
       row += warps) {
    float sum = 0.f;
    for (int d = lane; d < head_dim; d += 32) {
      sum += to_float(out[row * head_dim + d]) * to_float(grad_out[row * head_dim + d]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[row] = sum;
  }
}

template <class T>
__global__ void convert_from_f32_kernel(const float* __restrict__ source, T* __restrict__ out, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = from_float<T>(source[i]);
  }
}

// dq[i] = the sum of the key blocks' slices 0..(row's query block) of element i, in that order:
// slice b holds key block b's share of dQ for the rows it reached (those at or after its diagonal),
// and nothing for the rows before, which it never wrote. count = BH * T * D, one slice's elements.
template <class T>
__global__ void sum_dq_slices_kernel(const float* __restrict__ slices, T* __restrict__ out, int64_t count, int seq,
                                     int head_dim) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int row = static_cast<int>((i / head_dim) % seq);
    float sum = 0.f;
    for (int block = 0; block <= row / kBlock; ++block) sum += slices[block * count + i];
    out[i] = from_float<T>(sum);
  }
}

template <int D>
constexpr int backward_stages() {
  return D <= 64 ? 2 : 1;  // D = 128 single-buffers Q / dO so that two blocks fit on an SM
}
template <int D>
constexpr int backward_smem_bytes() {
  constexpr int tile = kBlock * (D + kPad) * 2;
  return tile * 2                                   // K, V
         + tile * 2 * backward_stages<D>()          // Q, dO
         + kBlock * (kBlock + kPad) * 2             // dS^T
         + 2 * kBlock * 4 * backward_stages<D>();   // lse (log2 domain), delta
}

// Stats for query rows [row0, row0 + 64): lse * log2(e) and delta; 0 past the end.
__device__ __forceinline__ void load_stats(float* s_lse, float* s_delta, const float* lse, const float* delta,
                                           int row0, int seq, int tid) {
  if (tid < kBlock) {
    const int row = row0 + tid;
    s_lse[tid] = row < seq ? lse[row] * kLog2e : 0.f;
  } else {
    const int row = row0 + tid - kBlock;
    s_delta[tid - kBlock] = row < seq ? delta[row] : 0.f;
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ grad_out, const float* __restrict__ lse,
                          const float* __restrict__ delta, float* __restrict__ dq_accum, T* __restrict__ dk,
                          T* __restrict__ dv, int seq, int group, float scale, float scale_log2,
                          int64_t dq_slice_elements) {
  static_assert(D % 32 == 0 && D <= kFlashMaxDim);
  constexpr int kStages = backward_stages<D>();
  constexpr int kDqChunk = D % 64 == 0 ? 64 : 32;  // dQ columns per pass of the dQ product
  constexpr int kStride = D + kPad;
  constexpr int kTile = kBlock * kStride;
  constexpr int kDsStride = kBlock + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_k = reinterpret_cast<T*>(smem_raw);
  T* s_v = s_k + kTile;
  T* s_q = s_v + kTile;                  // kStages
  T* s_do = s_q + kStages * kTile;       // kStages
  T* s_ds = s_do + kStages * kTile;      // [64 keys][64 queries + pad]
  float* s_lse = reinterpret_cast<float*>(s_ds + kBlock * kDsStride);  // kStages x 64
  float* s_delta = s_lse + kStages * kBlock;                            // kStages x 64

  const int n_block = blockIdx.x;  // key block; the first ones have the most query blocks
  const int64_t head = static_cast<int64_t>(blockIdx.y) * seq * D;  // the kv head
  const T* kh = k + head;
  const T* vh = v + head;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_blocks = (seq + kBlock - 1) / kBlock;
  const int first = n_block;  // query blocks before the diagonal see none of these keys
  // Steps: the query blocks first..m_blocks-1 of each of the group's query heads in turn.
  const int blocks_per_head = m_blocks - first;
  const int steps = group * blocks_per_head;
  const auto query_head_of = [&](int step) {
    return static_cast<int64_t>(blockIdx.y) * group + step / blocks_per_head;
  };
  const auto query_block_of = [&](int step) { return first + step % blocks_per_head; };
  // Loads step's Q and dO tiles and row statistics into `stage`.
  const auto load_step = [&](int step, int stage) {
    const int64_t query_head = query_head_of(step);
    const int row0 = query_block_of(step) * kBlock;
    load_tile<T, D>(s_q + stage * kTile, q + query_head * seq * D, row0, seq, tid);
    load_tile<T, D>(s_do + stage * kTile, grad_out + query_head * seq * D, row0, seq, tid);
    load_stats(s_lse + stage * kBlock, s_delta + stage * kBlock, lse + query_head * seq, delta + query_head * seq,
               row0, seq, tid);
  };

  load_tile<T, D>(s_k, kh, n_block * kBlock, seq, tid);
  load_tile<T, D>(s_v, vh, n_block * kBlock, seq, tid);
  load_step(0, 0);
  cp_async_commit();

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;
  }
  const int key_row[2] = {n_block * kBlock + warp * 16 + lane / 4, n_block * kBlock + warp * 16 + lane / 4 + 8};

  for (int step = 0; step < steps; ++step) {
    const int i = query_block_of(step);
    // dq_slice_elements 0: the one scratch, added to with atomics; else this key block's slice.
    float* dq_h = dq_accum + n_block * dq_slice_elements + query_head_of(step) * seq * D;
    const int stage = kStages == 2 ? step & 1 : 0;
    if constexpr (kStages == 2) {
      if (step + 1 < steps) load_step(step + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      if (step > 0) {
        load_step(step, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();

    const T* q_tile = s_q + stage * kTile;
    const T* do_tile = s_do + stage * kTile;
    const float* lse_tile = s_lse + stage * kBlock;
    const float* delta_tile = s_delta + stage * kBlock;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and the 64 queries.
    float p[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a_k[4], a_v[4];
      ldmatrix_x4(a_k, a_address(s_k, kStride, warp * 16, kk * 16, lane, sizeof(T)));
      ldmatrix_x4(a_v, a_address(s_v, kStride, warp * 16, kk * 16, lane, sizeof(T)));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, b_nk_address(q_tile, kStride, np * 16, kk * 16, lane, sizeof(T)));
        mma_16816<T>(p[2 * np], a_k, b[0], b[1]);
        mma_16816<T>(p[2 * np + 1], a_k, b[2], b[3]);
        ldmatrix_x4(b, b_nk_address(do_tile, kStride, np * 16, kk * 16, lane, sizeof(T)));
        mma_16816<T>(dp[2 * np], a_v, b[0], b[1]);
        mma_16816<T>(dp[2 * np + 1], a_v, b[2], b[3]);
      }
    }

    // P^T = exp(S^T * scale - lse[query]) where query >= key (and query < T); else 0.
    // dS^T = P^T * (dP^T - delta[query]) * scale.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = nt * 8 + 2 * (lane % 4) + (e & 1);
        const int query = i * kBlock + column;
        const bool keep = query >= key_row[e >> 1] && query < seq;
        const float probability = keep ? exp2f(p[nt][e] * scale_log2 - lse_tile[column]) : 0.f;
        p[nt][e] = probability;
        dp[nt][e] = probability * (dp[nt][e] - delta_tile[column]) * scale;
      }
    }

    // dV += P^T dO and dK += dS^T Q (k = the 64 queries, four chunks of 16).
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      uint32_t p_frag[4], ds_frag[4];
      p_frag[0] = pack2<T>(p[2 * kc][0], p[2 * kc][1]);
      p_frag[1] = pack2<T>(p[2 * kc][2], p[2 * kc][3]);
      p_frag[2] = pack2<T>(p[2 * kc + 1][0], p[2 * kc + 1][1]);
      p_frag[3] = pack2<T>(p[2 * kc + 1][2], p[2 * kc + 1][3]);
      ds_frag[0] = pack2<T>(dp[2 * kc][0], dp[2 * kc][1]);
      ds_frag[1] = pack2<T>(dp[2 * kc][2], dp[2 * kc][3]);
      ds_frag[2] = pack2<T>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
      ds_frag[3] = pack2<T>(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
      // dS^T to shared memory ([key][query]) for the dQ product below.
      {
        const int r = warp * 16 + lane / 4, col = kc * 16 + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(s_ds + r * kDsStride + col) = ds_frag[0];
        *reinterpret_cast<uint32_t*>(s_ds + (r + 8) * kDsStride + col) = ds_frag[1];
        *reinterpret_cast<uint32_t*>(s_ds + r * kDsStride + col + 8) = ds_frag[2];
        *reinterpret_cast<uint32_t*>(s_ds + (r + 8) * kDsStride + col + 8) = ds_frag[3];
      }
#pragma unroll
      for (int dpair = 0; dpair < D / 16; ++dpair) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, b_kn_address(do_tile, kStride, kc * 16, dpair * 16, lane, sizeof(T)));
        mma_16816<T>(dv_acc[2 * dpair], p_frag, b[0], b[1]);
        mma_16816<T>(dv_acc[2 * dpair + 1], p_frag, b[2], b[3]);
        ldmatrix_x4_trans(b, b_kn_address(q_tile, kStride, kc * 16, dpair * 16, lane, sizeof(T)));
        mma_16816<T>(dk_acc[2 * dpair], ds_frag, b[0], b[1]);
        mma_16816<T>(dk_acc[2 * dpair + 1], ds_frag, b[2], b[3]);
      }
    }
    __syncthreads();  // dS^T complete

    // dQ[16 rows of this warp] += dS K, with dS read transposed from s_ds; f32 atomics, or stores
    // into this key block's slice (each of its elements written by this thread alone).
    {
      uint32_t ds_a[4][4];
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        ldmatrix_x4_trans(ds_a[kc], a_km_address(s_ds, kDsStride, warp * 16, kc * 16, lane, sizeof(T)));
      }
      const int row0 = i * kBlock + warp * 16 + lane / 4;
#pragma unroll
      for (int chunk = 0; chunk < D / kDqChunk; ++chunk) {
        float dq[kDqChunk / 8][4];
#pragma unroll
        for (int nt = 0; nt < kDqChunk / 8; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
#pragma unroll
          for (int dpair = 0; dpair < kDqChunk / 16; ++dpair) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, b_kn_address(s_k, kStride, kc * 16, chunk * kDqChunk + dpair * 16, lane,
                                              sizeof(T)));
            mma_16816<T>(dq[2 * dpair], ds_a[kc], b[0], b[1]);
            mma_16816<T>(dq[2 * dpair + 1], ds_a[kc], b[2], b[3]);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 8 * h;
          if (row < seq) {
            float* dq_row = dq_h + static_cast<int64_t>(row) * D + chunk * kDqChunk + 2 * (lane % 4);
            if (dq_slice_elements != 0) {
#pragma unroll
              for (int nt = 0; nt < kDqChunk / 8; ++nt) {
                *reinterpret_cast<float2*>(dq_row + nt * 8) = make_float2(dq[nt][2 * h], dq[nt][2 * h + 1]);
              }
              continue;
            }
#pragma unroll
            for (int nt = 0; nt < kDqChunk / 8; ++nt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
              atomicAdd(reinterpret_cast<float2*>(dq_row + nt * 8), make_float2(dq[nt][2 * h], dq[nt][2 * h + 1]));
#else
              atomicAdd(dq_row + nt * 8, dq[nt][2 * h]);
              atomicAdd(dq_row + nt * 8 + 1, dq[nt][2 * h + 1]);
#endif
            }
          }
        }
      }
    }
    __syncthreads();  // s_ds and this stage's Q / dO are free again
  }

  // dK (already scaled through dS) and dV for this warp's 16 keys.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = key_row[h];
    if (row < seq) {
      T* dk_row = dk + head + static_cast<int64_t>(row) * D + 2 * (lane % 4);
      T* dv_row = dv + head + static_cast<int64_t>(row) * D + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(dk_row + dt * 8) = pack2<T>(dk_acc[dt][2 * h], dk_acc[dt][2 * h + 1]);
        *reinterpret_cast<uint32_t*>(dv_row + dt * 8) = pack2<T>(dv_acc[dt][2 * h], dv_acc[dt][2 * h + 1]);
      }
    }
  }
}

// --- Simple f32 path (no tensor cores; any head dim <= 256) ------------------------------------
// Each warp owns one row (4 rows per block of 128 threads); lane l holds elements l, l + 32, ... of
// the row (kMaxDim / 32 of them: kMaxDim 128 for head dims up to 128, 256 above). The other operand
// is streamed through shared memory in tiles of SimpleTile<kMaxDim> rows (32 rows of 128, 16 of 256:
// 32 KiB for two tiles either way).

constexpr int kSimpleRows = 4;
constexpr int kSimpleMaxDim = 256;

template <int kMaxDim>
constexpr int simple_tile_rows() {
  return 32 * 128 / kMaxDim;
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Loads rows [row0, row0 + tile rows) of a [T, D] f32 matrix into tile[rows][kMaxDim]: zeros past
// the end and in the columns past D (the lanes read all kMaxDim columns, and 0 * garbage could be NaN).
template <int kMaxDim>
__device__ __forceinline__ void load_simple_tile(float* tile, const float* source, int row0, int seq, int head_dim) {
  for (int index = threadIdx.x; index < simple_tile_rows<kMaxDim>() * kMaxDim; index += blockDim.x) {
    const int row = index / kMaxDim, d = index % kMaxDim;
    tile[index] = row0 + row < seq && d < head_dim ? source[static_cast<int64_t>(row0 + row) * head_dim + d] : 0.f;
  }
}

// Grid (query rows / 4, BH); query head row blockIdx.y reads kv head row blockIdx.y / group.
template <int kMaxDim>
__global__ void __launch_bounds__(128)
    simple_forward_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          float* __restrict__ o, float* __restrict__ lse, int seq, int head_dim, int group,
                          float scale) {
  constexpr int kTile = simple_tile_rows<kMaxDim>();
  constexpr int kPerLane = kMaxDim / 32;
  __shared__ float s_k[kTile * kMaxDim];
  __shared__ float s_v[kTile * kMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * seq * head_dim;
  const int64_t kv_head = static_cast<int64_t>(blockIdx.y / group) * seq * head_dim;
  const int row = blockIdx.x * kSimpleRows + warp;
  const int last_row = min(blockIdx.x * kSimpleRows + kSimpleRows - 1, seq - 1);
  float query[kPerLane], acc[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    query[c] = row < seq && d < head_dim ? q[head + static_cast<int64_t>(row) * head_dim + d] : 0.f;
    acc[c] = 0.f;
  }
  float maximum = -INFINITY, total = 0.f;
  for (int tile0 = 0; tile0 <= last_row; tile0 += kTile) {
    __syncthreads();
    load_simple_tile<kMaxDim>(s_k, k + kv_head, tile0, seq, head_dim);
    load_simple_tile<kMaxDim>(s_v, v + kv_head, tile0, seq, head_dim);
    __syncthreads();
    if (row < seq) {
      for (int s = 0; s < kTile && tile0 + s <= row; ++s) {
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) dot += query[c] * s_k[s * kMaxDim + lane + 32 * c];
        const float score = warp_sum(dot) * scale;
        const float new_max = fmaxf(maximum, score);
        const float correction = expf(maximum - new_max);
        const float weight = expf(score - new_max);
        total = total * correction + weight;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) acc[c] = acc[c] * correction + weight * s_v[s * kMaxDim + lane + 32 * c];
        maximum = new_max;
      }
    }
  }
  if (row < seq) {
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) o[head + static_cast<int64_t>(row) * head_dim + d] = acc[c] / total;
    }
    if (lane == 0) lse[static_cast<int64_t>(blockIdx.y) * seq + row] = maximum + logf(total);
  }
}

// dq[t] = scale * sum_{s <= t} P_ts (dP_ts - delta_t) k_s; one warp per query row; grid as the forward.
template <int kMaxDim>
__global__ void __launch_bounds__(128)
    simple_backward_dq_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                              const float* __restrict__ grad_out, const float* __restrict__ lse,
                              const float* __restrict__ delta, float* __restrict__ dq, int seq, int head_dim,
                              int group, float scale) {
  constexpr int kTile = simple_tile_rows<kMaxDim>();
  constexpr int kPerLane = kMaxDim / 32;
  __shared__ float s_k[kTile * kMaxDim];
  __shared__ float s_v[kTile * kMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * seq * head_dim;
  const int64_t kv_head = static_cast<int64_t>(blockIdx.y / group) * seq * head_dim;
  const int64_t stat = static_cast<int64_t>(blockIdx.y) * seq;
  const int row = blockIdx.x * kSimpleRows + warp;
  const int last_row = min(blockIdx.x * kSimpleRows + kSimpleRows - 1, seq - 1);
  float query[kPerLane], grad[kPerLane], acc[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    const bool inside = row < seq && d < head_dim;
    query[c] = inside ? q[head + static_cast<int64_t>(row) * head_dim + d] : 0.f;
    grad[c] = inside ? grad_out[head + static_cast<int64_t>(row) * head_dim + d] : 0.f;
    acc[c] = 0.f;
  }
  const float row_lse = row < seq ? lse[stat + row] : 0.f;
  const float row_delta = row < seq ? delta[stat + row] : 0.f;
  for (int tile0 = 0; tile0 <= last_row; tile0 += kTile) {
    __syncthreads();
    load_simple_tile<kMaxDim>(s_k, k + kv_head, tile0, seq, head_dim);
    load_simple_tile<kMaxDim>(s_v, v + kv_head, tile0, seq, head_dim);
    __syncthreads();
    if (row < seq) {
      for (int s = 0; s < kTile && tile0 + s <= row; ++s) {
        float dot = 0.f, dot_grad = 0.f;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          dot += query[c] * s_k[s * kMaxDim + lane + 32 * c];
          dot_grad += grad[c] * s_v[s * kMaxDim + lane + 32 * c];
        }
        const float probability = expf(warp_sum(dot) * scale - row_lse);
        const float grad_score = probability * (warp_sum(dot_grad) - row_delta) * scale;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) acc[c] += grad_score * s_k[s * kMaxDim + lane + 32 * c];
      }
    }
  }
  if (row < seq) {
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) dq[head + static_cast<int64_t>(row) * head_dim + d] = acc[c];
    }
  }
}

// dv[s] = sum_{h in group} sum_{t >= s} P_ts dO_t, dk[s] = scale * sum_{h in group} sum_{t >= s}
// P_ts (dP_ts - delta_t) q_t; one warp per key. Grid (keys / 4, BKV): kv head row blockIdx.y sums
// over query head rows blockIdx.y * group + 0..group-1.
template <int kMaxDim>
__global__ void __launch_bounds__(128)
    simple_backward_dkdv_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ grad_out,
                                const float* __restrict__ lse, const float* __restrict__ delta,
                                float* __restrict__ dk, float* __restrict__ dv, int seq, int head_dim, int group,
                                float scale) {
  constexpr int kTile = simple_tile_rows<kMaxDim>();
  constexpr int kPerLane = kMaxDim / 32;
  __shared__ float s_q[kTile * kMaxDim];
  __shared__ float s_do[kTile * kMaxDim];
  __shared__ float s_lse[kTile];
  __shared__ float s_delta[kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t kv_head = static_cast<int64_t>(blockIdx.y) * seq * head_dim;
  const int row = blockIdx.x * kSimpleRows + warp;  // key
  const int first_row = blockIdx.x * kSimpleRows;
  float key[kPerLane], value[kPerLane], acc_k[kPerLane], acc_v[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + 32 * c;
    const bool inside = row < seq && d < head_dim;
    key[c] = inside ? k[kv_head + static_cast<int64_t>(row) * head_dim + d] : 0.f;
    value[c] = inside ? v[kv_head + static_cast<int64_t>(row) * head_dim + d] : 0.f;
    acc_k[c] = acc_v[c] = 0.f;
  }
  for (int member = 0; member < group; ++member) {
    const int64_t query_head = static_cast<int64_t>(blockIdx.y) * group + member;
    const int64_t head = query_head * seq * head_dim;
    const int64_t stat = query_head * seq;
    for (int tile0 = first_row; tile0 < seq; tile0 += kTile) {
      __syncthreads();
      load_simple_tile<kMaxDim>(s_q, q + head, tile0, seq, head_dim);
      load_simple_tile<kMaxDim>(s_do, grad_out + head, tile0, seq, head_dim);
      if (threadIdx.x < kTile) {
        const int t = tile0 + threadIdx.x;
        s_lse[threadIdx.x] = t < seq ? lse[stat + t] : 0.f;
        s_delta[threadIdx.x] = t < seq ? delta[stat + t] : 0.f;
      }
      __syncthreads();
      if (row < seq) {
        for (int s = 0; s < kTile && tile0 + s < seq; ++s) {
          if (tile0 + s < row) continue;
          float dot = 0.f, dot_grad = 0.f;
#pragma unroll
          for (int c = 0; c < kPerLane; ++c) {
            dot += key[c] * s_q[s * kMaxDim + lane + 32 * c];
            dot_grad += value[c] * s_do[s * kMaxDim + lane + 32 * c];
          }
          const float probability = expf(warp_sum(dot) * scale - s_lse[s]);
          const float grad_score = probability * (warp_sum(dot_grad) - s_delta[s]) * scale;
#pragma unroll
          for (int c = 0; c < kPerLane; ++c) {
            acc_v[c] += probability * s_do[s * kMaxDim + lane + 32 * c];
            acc_k[c] += grad_score * s_q[s * kMaxDim + lane + 32 * c];
          }
        }
      }
    }
  }
  if (row < seq) {
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) {
        dk[kv_head + static_cast<int64_t>(row) * head_dim + d] = acc_k[c];
        dv[kv_head + static_cast<int64_t>(row) * head_dim + d] = acc_v[c];
      }
    }
  }
}

// --- Host launchers (raw pointers; the caller checked shapes, dtypes and alignment) -------------
// bh = batch * heads (at most 65535: the grid's y dimension), seq = T > 0.

inline unsigned int blocks_for(int64_t count, int per_block) {
  int64_t blocks = (count + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  return static_cast<unsigned int>(blocks);
}

template <class T, int D>
void launch_forward(const T* q, const T* k, const T* v, T* o, float* lse, int64_t bh, int group, int seq,
                    float scale, cudaStream_t stream, int device) {
  constexpr int smem = forward_smem_bytes<D>();
  allow_dynamic_shared_memory<flash_forward_kernel<T, D>>(smem, device);
  const dim3 grid((seq + kBlock - 1) / kBlock, static_cast<unsigned int>(bh));
  flash_forward_kernel<T, D><<<grid, kThreads, smem, stream>>>(q, k, v, o, lse, seq, group, scale * kLog2e);
  WEFT_CUDA_CHECK_LAUNCH();
}

// The f32 scratch dq_accum of launch_backward, in elements: one [bh, T, D], or one per key block
// when its dQ is summed in order.
inline int64_t dq_scratch_elements(int64_t bh, int seq, int width, bool ordered) {
  const int64_t one = bh * seq * width;
  return ordered ? (seq + kBlock - 1) / kBlock * one : one;
}

// delta is f32 scratch of bh * seq elements and dq_accum of dq_scratch_elements(bh, seq, D, ordered);
// dk, dv [bh / group, T, D]. ordered: dQ summed in a fixed order (the same bits every run).
template <class T, int D>
void launch_backward(const T* q, const T* k, const T* v, const T* o, const T* grad_out, const float* lse,
                     float* delta, float* dq_accum, T* dq, T* dk, T* dv, int64_t bh, int group, int seq, float scale,
                     bool ordered, cudaStream_t stream, int device) {
  const int64_t rows = bh * seq;
  attention_delta_kernel<T><<<blocks_for(rows, 8), 256, 0, stream>>>(o, grad_out, delta, rows, D);
  WEFT_CUDA_CHECK_LAUNCH();
  // The slices need no zeroes: a row's sum reads only the slices of the key blocks that wrote it.
  if (!ordered) WEFT_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, static_cast<size_t>(rows) * D * sizeof(float), stream));
  constexpr int smem = backward_smem_bytes<D>();
  allow_dynamic_shared_memory<flash_backward_kernel<T, D>>(smem, device);
  const dim3 grid((seq + kBlock - 1) / kBlock, static_cast<unsigned int>(bh / group));
  flash_backward_kernel<T, D><<<grid, kThreads, smem, stream>>>(q, k, v, grad_out, lse, delta, dq_accum, dk, dv,
                                                                seq, group, scale, scale * kLog2e,
                                                                ordered ? rows * D : 0);
  WEFT_CUDA_CHECK_LAUNCH();
  if (ordered) {
    sum_dq_slices_kernel<T><<<blocks_for(rows * D, 256), 256, 0, stream>>>(dq_accum, dq, rows * D, seq, D);
  } else {
    convert_from_f32_kernel<T><<<blocks_for(rows * D, 256), 256, 0, stream>>>(dq_accum, dq, rows * D);
  }
  WEFT_CUDA_CHECK_LAUNCH();
}

inline void launch_simple_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t bh,
                                  int group, int seq, int head_dim, float scale, cudaStream_t stream) {
  const dim3 grid((seq + kSimpleRows - 1) / kSimpleRows, static_cast<unsigned int>(bh));
  if (head_dim <= 128) {
    simple_forward_kernel<128><<<grid, 128, 0, stream>>>(q, k, v, o, lse, seq, head_dim, group, scale);
  } else {
    simple_forward_kernel<256><<<grid, 128, 0, stream>>>(q, k, v, o, lse, seq, head_dim, group, scale);
  }
  WEFT_CUDA_CHECK_LAUNCH();
}

// delta is f32 scratch of bh * seq elements; dk, dv [bh / group, T, head_dim].
inline void launch_simple_backward(const float* q, const float* k, const float* v, const float* o,
                                   const float* grad_out, const float* lse, float* delta, float* dq, float* dk,
                                   float* dv, int64_t bh, int group, int seq, int head_dim, float scale,
                                   cudaStream_t stream) {
  const int64_t rows = bh * seq;
  attention_delta_kernel<float><<<blocks_for(rows, 8), 256, 0, stream>>>(o, grad_out, delta, rows, head_dim);
  WEFT_CUDA_CHECK_LAUNCH();
  const dim3 grid((seq + kSimpleRows - 1) / kSimpleRows, static_cast<unsigned int>(bh));
  const dim3 kv_grid((seq + kSimpleRows - 1) / kSimpleRows, static_cast<unsigned int>(bh / group));
  const auto run = [&]<int kMaxDim>() {
    simple_backward_dq_kernel<kMaxDim>
        <<<grid, 128, 0, stream>>>(q, k, v, grad_out, lse, delta, dq, seq, head_dim, group, scale);
    WEFT_CUDA_CHECK_LAUNCH();
    simple_backward_dkdv_kernel<kMaxDim>
        <<<kv_grid, 128, 0, stream>>>(q, k, v, grad_out, lse, delta, dk, dv, seq, head_dim, group, scale);
    WEFT_CUDA_CHECK_LAUNCH();
  };
  if (head_dim <= 128) {
    run.operator()<128>();
  } else {
    run.operator()<256>();
  }
}

}  // namespace weft::cuda::flash
