// A bf16 matrix product for Hopper (sm_90a) with its epilogue fused: D = A · Bᵀ (+ bias) (then GELU,
// the tanh form, with the pre-activation kept for backward), or GELU's backward D = (A · B) ⊙
// gelu'(pre-activation) with B read N-major; f32 accumulation. It exists because
// cuBLASLt's epilogue kernels for GELU run well below its plain ones (docs/performance.md,
// 2026-12-03/04: the GPT-2 up-projection with bias + GELU_AUX at 72% of the plain product's pace),
// and weft's one-GPU targets (issue #16) need those epilogues at the plain products' pace.
//
// Status: the runtime calls it (WEFT_HOPPER_GEMM, runtime/cuda/hopper_products.h) for linear_gelu's
// bias + GELU forward, GELU's backward in the next linear's dX product and a linear's dX product with
// its bias gradient where asked, and by default for Llama's SwiGLU products forward and backward;
// cuBLASLt runs every other product. The backward (B N-major, kGeluBackward, kSumAColumns) was
// written on 2026-12-05 without a GPU, then checked right on an H100 by the benchmark;
// docs/performance.md (sixteenth session) has its first figures. SwiGLU's (kSwiglu,
// kSwigluBackward) were written on 2026-12-06 (seventeenth session), right on an H200 the first
// time, and slower than cuBLASLt's products with weft's SwiGLU passes until the eighteenth session
// moved both to the 192-column tiling and made their math cheaper (runtime/cuda/silu.cuh): then 18%
// (forward) and 23% (backward) faster.
// tools/cuda_hopper_gemm_benchmark checks every tiling against cuBLASLt and a reference and times
// both; docs/performance.md (2026-12-05, fourteenth and fifteenth sessions) has where it stands and
// why. In the same call as cuBLASLt: the bias + GELU product 5-10% faster than cuBLASLt's on
// GPT-2's up-projection (alternating 128 columns; since the twenty-fourth session, whose epilogue
// computes GELU while TMA reads the pre-activation, 15% on alternating 192 columns) and 6-12% on
// the 1.3B shape's (alternating 192 columns in bands of 16), the plain products level with
// cuBLASLt's on GPT-2's shapes and behind at K = 8192. Under Nsight Compute the tensor pipe is busy
// 82-85% of the time in the 192-column tiling on GPT-2's up-projection against 91% in cuBLASLt's
// kernel, with neither shared memory (60-65% of its peak) nor L2 at their limits.
//
// Shapes (row-major, leading dimension = the row's length):
//   a        [M, K] bf16, K contiguous (the activations, or dY in backward)
//   b        [N, K] bf16, K contiguous (a linear layer's weight, out × in: BLayout::kNByK), or
//            [K, N] bf16, N contiguous (the next linear's weight in backward: BLayout::kKByN)
//   bias     [N] bf16 or null
//   out      [M, N] bf16                      = epilogue(a · bᵀ + bias), or (a · b) ⊙ gelu'(pre_gelu)
//   pre_gelu [M, N] bf16 or null              = a · bᵀ + bias, written by kBiasGelu; read by kGeluBackward
// Invariants: K and N multiples of 8 (TMA's 16-byte row strides); M, N, K otherwise free: TMA fills
// tiles past the edges with zeros and clips its stores to [M, N]. Everything 16-byte aligned.
//
// How it runs: a persistent CTA per SM walks its tiles of D. A producer warpgroup (one lane active,
// its registers given to the others through setmaxnreg) issues TMA loads of 64-wide K slices of A
// and B (128-byte swizzle, the layout wgmma reads) into a ring of stages, each guarded by a "full"
// mbarrier (the bytes have landed) and an "empty" one (the consumers are done with it). Two consumer
// warpgroups run wgmma on each slice, keep one slice's products in flight, then stage their results
// in shared memory (bf16, swizzled like the operands) for TMA to store while they go on.
// - Cooperative tilings: both warpgroups share a 128 × 256 tile, 64 rows each (wgmma m64n256k16).
// - The alternating tiling: each warpgroup takes every other 128 × 128 tile (two m64n128k16 halves),
//   and they take turns, so that one's epilogue runs under the other's products.
// - B N-major (BLayout::kKByN): a stage's B slice is kBlockN / 64 TMA boxes of [64 k, 64 columns],
//   read by wgmma's transposed-B form (n_major_descriptor).
// - GELU's backward: at a tile's start, once its last stores have read the staging boxes, a
//   warpgroup's leader has TMA load the first boxes of the tile's pre-activation into them (each
//   counted on its slot_loaded barrier), so the loads run under the products; the epilogue reads
//   each value from the place its result goes, and stores box by box, each staging box loaded again
//   with a later box's pre-activation as soon as its store has read it.
// - SwiGLU's backward in rounds, with two inputs (gate and up) and two outputs (their gradients)
//   for each output box: the first round loaded at the tile's start (counted on pre_loaded), half
//   as many output boxes a staging round, each gradient written over the input box it was read
//   from.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/dependent_launch.cuh"  // the launchers start it as a programmatic dependent
#include "runtime/cuda/silu.cuh"              // SwiGLU's epilogues: the SwiGLU passes' bits

namespace weft::cuda::hopper {

// Every tiling's K slice: 64 bf16 are the 128 bytes the swizzle (and TMA's box for it) spans.
constexpr int kBlockK = 64;

// A CTA's tiling: kBlockN columns of a 128-row tile, computed by two consumer warpgroups, fed
// through kStages stages of 64-wide K slices.
// kClusterRows CTAs of a cluster take vertically adjacent tiles (the same columns of B): each loads
// its own A slice and a 1 / kClusterRows share of the B slice, which TMA multicasts to every CTA of
// the cluster. That cuts the loads' L2 traffic (GPT-2's up-projection: from 80% of L2's peak to 66%
// under Nsight Compute), but the pair then waits for its slower CTA at every stage: measured faster
// only on the 1.3B up-projection (docs/performance.md, 2026-12-05 fifteenth session).
template <int kColumns, int kStageCount, bool kAlternating = false, int kStagingBoxCount = 0, int kClusterRows = 1>
struct Tiling {
  static constexpr int kBlockM = 128, kBlockN = kColumns, kBlockK = hopper::kBlockK, kStages = kStageCount;
  static constexpr int kConsumers = 2;
  static constexpr int kCluster = kClusterRows;
  static constexpr int kBSliceRows = kBlockN / kCluster;  // rows of B each CTA of a cluster loads
  static_assert(kBSliceRows % 8 == 0, "Tiling: B's share keeps whole 8-row swizzle groups");
  // Alternating ("ping-pong"): each consumer warpgroup computes whole tiles, every kConsumers-th of
  // the CTA's, so one's epilogue runs while the other's products run. Otherwise the warpgroups split
  // each tile's rows and finish it together.
  static constexpr bool kPingPong = kAlternating;
  static constexpr int kHalves = kBlockM / 64 / (kPingPong ? 1 : kConsumers);  // 64-row halves per warpgroup
  static constexpr int kAccumulators = kBlockN / 2;          // f32 values per thread per half
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + 128;  // and the producer warpgroup
  static constexpr int kATileBytes = kBlockM * kBlockK * 2;  // [128, 64] bf16
  static constexpr int kBTileBytes = kBlockN * kBlockK * 2;  // [kBlockN, 64] bf16
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  // Each consumer warpgroup stages its output in [64, 64] boxes of 128-byte swizzled rows (8 KiB
  // each) for TMA's stores: all of its boxes at once, or kStagingBoxCount at a time (in rounds, each
  // waiting until TMA has read the round before), leaving shared memory to the stages.
  static constexpr int kBoxes = kHalves * kBlockN / 64;
  static constexpr int kStagingBoxes = kStagingBoxCount == 0 ? kBoxes : kStagingBoxCount;
  // SwiGLU's backward takes three staging boxes an output box, so its rounds take a third as many
  // output boxes, which must divide the boxes (1 for tilings of fewer than three staging boxes, which
  // cannot take it, so that the division stays defined).
  static constexpr int kSwigluBackwardRoundBoxes = kStagingBoxes >= 3 ? kStagingBoxes / 3 : 1;
  static_assert(kBoxes % kStagingBoxes == 0 || (kStagingBoxes % 3 == 0 && kBoxes % kSwigluBackwardRoundBoxes == 0),
                "Tiling: the staging rounds divide the boxes");
  static constexpr int kStagingBytes = kStagingBoxes * 8192;
  // + alignment + barriers: full and empty a stage, turn and pre_loaded a warpgroup, slot_loaded a
  // staging box of each warpgroup.
  static constexpr int kSharedBytes = kStages * kStageBytes + kConsumers * kStagingBytes + 1024 +
                                      (2 * kStages + 2 * kConsumers + kConsumers * kStagingBoxes) * 8;
  static_assert(kSharedBytes <= 227 * 1024, "Tiling: more shared memory than a Hopper CTA may have");
};
// The tilings docs/performance.md compares (2026-12-05, fourteenth and fifteenth sessions).
using WideTiling = Tiling<256, 3>;                  // all of a warpgroup's output staged at once
using WideFourStages = Tiling<256, 4, false, 2>;    // a fourth stage; the output staged half at a time
using AlternatingTiling = Tiling<128, 5, true>;
using AlternatingWide = Tiling<192, 4, true, 3>;  // 192 accumulators a thread; the output staged in halves
// SwiGLU's backward stages three boxes for each output box (gate, up and the product; the gradients
// then overwrite gate and up): AlternatingWide's three take a warpgroup's 6 output boxes one at a
// time. Measured against it and slower (docs/performance.md, 2026-12-06): 128 columns with three
// staging boxes beside five stages, or six beside four; 192 columns with six beside three stages.
// The columns of kSwiglu's output boxes for tiling T (its tiles cover kBlockN / 2 columns of each
// output): 64, the 128-byte swizzle's span, where those come in 64s; otherwise all of them in one
// unswizzled box (the 192-column tiling's 96: rows of 192 bytes, which TMA stores without a swizzle;
// the fragment layout's stores then meet 4-way bank conflicts, a few hundred cycles a tile).
template <typename T>
__host__ __device__ constexpr int swiglu_box_columns() {
  return (T::kBlockN / 2) % 64 == 0 ? 64 : T::kBlockN / 2;
}
// The same tilings with pairs of CTAs sharing B's loads.
using WideFourStagesPaired = Tiling<256, 4, false, 2, 2>;
using AlternatingPaired = Tiling<128, 5, true, 0, 2>;
using AlternatingWidePaired = Tiling<192, 4, true, 3, 2>;
// A deeper ring bought with less staging (the output staged two boxes at a time); five stages of
// 192 columns and six of 128 unpaired measured no faster (docs/performance.md).
using AlternatingSixStagesPaired = Tiling<128, 6, true, 2, 2>;

// What the epilogue applies to the product before the bf16 store: nothing, + bias, + bias then GELU
// (keeping the pre-activation when asked), GELU's backward: times gelu'(pre-activation), the
// pre-activation read from a matrix of the output's shape (cuBLASLt's DGELU epilogue), SwiGLU:
// the gate and up products and silu(gate) · up, all three stored, or SwiGLU's backward: the
// product is the gradient of silu(gate) · up, and the gate and up gradients are stored.
// kSwiglu: Llama's gate and up products at once, B's rows being the two weights' (see gemm_kernel).
// kSwigluBackward: the down-projection's dX product with B N-major, gate and up read as kGeluBackward
// reads the pre-activation (see gemm_kernel).
enum class Epilogue { kNone, kBias, kBiasGelu, kGeluBackward, kSwiglu, kSwigluBackward };

// How B lies in memory: [N, K] with K contiguous (a linear layer's weight as stored, for the forward
// X · Wᵀ), or [K, N] with N contiguous (the same weight in the backward dY · W, whose product's
// columns are the weight's). The shared-memory stage holds the same bytes either way; wgmma reads
// the second N-major.
enum class BLayout { kNByK, kKByN };

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

// The same load multicast: the box lands at the same offset of every CTA in cta_mask's cluster
// ranks, and is counted on each one's barrier at the same offset.
__device__ inline void tma_load_multicast(void* destination, const CUtensorMap* map, uint64_t* barrier, int column,
                                          int row, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(barrier)), "r"(column), "r"(row), "h"(cta_mask)
      : "memory");
}

__device__ inline uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// An arrival on the barrier at this barrier's offset in the cluster's CTA of that rank. Release at
// the CTA's scope, as a local arrival: the stage's readers are this CTA's wgmma, done by now; a
// cluster-scope release measured 2-3.5 times slower products.
__device__ inline void barrier_arrive_in(uint64_t* barrier, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(barrier)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// Every thread of every CTA of the cluster (not .aligned: the producer's lanes arrive apart).
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// A [64, 64] box of shared memory to (column, row) of the map's matrix; TMA clips what lies outside.
__device__ inline void tma_store(const CUtensorMap* map, const void* source, int column, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(shared_address(source)), "r"(column), "r"(row)
               : "memory");
}
__device__ inline void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until every committed store has read its shared memory (it may still be writing to global).
__device__ inline void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Until every committed store but the kPending last has read its shared memory.
template <int kPending>
__device__ inline void tma_store_wait_read_all_but() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
__device__ inline void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// A store to shared memory that the compiler may move global loads across (a plain store through a
// generic pointer could alias the bias, and every bias load would wait for the stores before it).
__device__ inline void store_shared_bits(void* destination, uint32_t bits) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(shared_address(destination)), "r"(bits));
}
__device__ inline void store_shared(void* destination, __nv_bfloat162 value) {
  store_shared_bits(destination, *reinterpret_cast<uint32_t*>(&value));
}
__device__ inline __nv_bfloat162 load_shared(const void* source) {
  uint32_t bits;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(bits) : "r"(shared_address(source)) : "memory");
  return *reinterpret_cast<__nv_bfloat162*>(&bits);
}
// 16 bytes at once (the address 16-byte aligned).
__device__ inline uint4 load_shared_chunk(const void* source) {
  uint4 bits;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(bits.x), "=r"(bits.y), "=r"(bits.z), "=r"(bits.w)
               : "r"(shared_address(source))
               : "memory");
  return bits;
}
__device__ inline void store_shared_chunk(void* destination, uint4 bits) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(shared_address(destination)), "r"(bits.x),
               "r"(bits.y), "r"(bits.z), "r"(bits.w)
               : "memory");
}
// Two f32 values rounded to the nearest bf16 (ties to even) and packed, low in the low half: the
// instruction __floats2bfloat162_rn uses, but volatile, so that the compiler keeps the conversion
// where it is written instead of sinking it to the packed value's use (and keeping the f32 values'
// registers until then).
__device__ inline uint32_t bf16_pair_bits(float low, float high) {
  uint32_t bits;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
  return bits;
}
// Shared-memory writes of this thread visible to TMA (the async proxy).
__device__ inline void fence_for_tma() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ inline void warpgroup_sync(int group) {
  asm volatile("bar.sync %0, 128;" ::"r"(group + 1) : "memory");
}

// The byte offset of bf16 element (row, column) in a [rows, 64] box with the 128-byte swizzle, the
// layout TMA moves and wgmma reads: row r's 16-byte chunk j sits at chunk j ^ (r % 8) of its 128
// bytes, which also puts the 8 rows of a fragment-layout store on 32 different banks. column is
// within the box (0 to 63); neither is negative.
__device__ inline int swizzled_offset(int row, int column) {
  return row * 128 + (((column / 8) ^ (row % 8)) * 16) + (column % 8) * 2;
}
// The same element's address in `box`, added term by term (as one int offset, the compiler folds
// fewer of the terms into the stores' immediate offsets: a few more instructions an epilogue).
template <typename Byte>
__device__ inline Byte* swizzled(Byte* box, int row, int column) {
  return box + row * 128 + (((column / 8) ^ (row % 8)) * 16) + (column % 8) * 2;
}

// wgmma's shared-memory operand: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ inline uint64_t operand_descriptor(const void* tile) {
  uint64_t descriptor = (shared_address(tile) & 0x3FFFF) >> 4;
  descriptor |= uint64_t{1} << 16;           // leading byte offset: unused with a 128-byte swizzle
  descriptor |= uint64_t{1024 >> 4} << 32;   // stride byte offset: one 8-row group
  descriptor |= uint64_t{1} << 62;           // swizzle mode: 128 bytes
  return descriptor;
}

// wgmma's B read N-major (imm-trans-b 1), 128-byte swizzle: each 128-byte row holds 64 columns of
// one k, 8 rows (k) make a 1024-byte swizzle atom, and the tile's 64-column blocks are
// kNMajorBoxBytes apart (one TMA box each). In the PTX ISA's terms for MN-major swizzled layouts:
// the leading byte offset is from one 64-column block to the next, the stride byte offset from one
// 8-row (k) group to the next.
constexpr uint32_t kNMajorBoxBytes = 64 * 128;
__device__ inline uint64_t n_major_descriptor(const void* tile) {
  uint64_t descriptor = (shared_address(tile) & 0x3FFFF) >> 4;
  descriptor |= uint64_t{kNMajorBoxBytes >> 4} << 16;  // leading byte offset: the next 64 columns
  descriptor |= uint64_t{1024 >> 4} << 32;             // stride byte offset: the next 8 k
  descriptor |= uint64_t{1} << 62;                     // swizzle mode: 128 bytes
  return descriptor;
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kInFlight>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kInFlight) : "memory");
}

// Keeps the compiler from moving reads of the accumulators across a wgmma wait.
template <int kCount>
__device__ inline void fence_registers(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d[64 × 128] += a[64 × 16] · b[128 × 16]ᵀ, both from shared memory; b read K-major (kTransposeB 0)
// or N-major (1).
template <int kTransposeB>
__device__ inline void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, %66;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "n"(kTransposeB));
}

// d[64 × 256] += a[64 × 16] · b[256 × 16]ᵀ, as wgmma_m64n128k16.
template <int kTransposeB>
__device__ inline void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, %130;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "n"(kTransposeB));
}

// d[64 × 192] += a[64 × 16] · b[192 × 16]ᵀ, as wgmma_m64n128k16.
template <int kTransposeB>
__device__ inline void wgmma_m64n192k16(float (&d)[96], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
      "%96, %97, 1, 1, 1, 0, %98;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(a), "l"(b), "n"(kTransposeB));
}

// The wgmma of a 64-row half with kCount accumulators a thread: 2 · kCount columns.
template <int kCount, int kTransposeB>
__device__ inline void wgmma_tile(float (&d)[kCount], uint64_t a, uint64_t b) {
  if constexpr (kCount == 64) {
    wgmma_m64n128k16<kTransposeB>(d, a, b);
  } else if constexpr (kCount == 96) {
    wgmma_m64n192k16<kTransposeB>(d, a, b);
  } else {
    static_assert(kCount == 128, "wgmma_tile: 128, 192 or 256 columns");
    wgmma_m64n256k16<kTransposeB>(d, a, b);
  }
}

// GELU, the tanh form (as cuBLASLt's GELU epilogue and weft's UnaryOp::kGelu): with u = c (x + a x³),
// gelu(x) = ½ x (1 + tanh u). Written as u = x (c + c a x²) and h + h tanh u with h = ½ x: five
// arithmetic instructions and the tanh, where the formula as written takes seven; the epilogue runs
// it for every value of a tile within the other warpgroup's products.
__device__ inline float gelu_tanh(float x) {
  constexpr float c = 0.7978845608028654f, a = 0.044715f;
  const float inner = x * fmaf(x * x, c * a, c);
  float tanh_inner;  // the hardware's approximation: 2^-11 relative, under bf16's 2^-8
  asm("tanh.approx.f32 %0, %1;" : "=f"(tanh_inner) : "f"(inner));
  const float half_x = 0.5f * x;
  return fmaf(half_x, tanh_inner, half_x);
}

// GELU's derivative, the tanh form, with the same tanh: with u = c (x + a x³) and t = tanh u,
// gelu'(x) = ½ (1 + t) + ½ x (1 − t²) c (1 + 3 a x²), written (as gelu_tanh) with the constants
// folded: ½ + ½ t, plus (1 − t²) times x (½ c + (3/2) c a x²).
__device__ inline float gelu_tanh_derivative(float x) {
  constexpr float c = 0.7978845608028654f, a = 0.044715f;
  const float x_squared = x * x;
  const float inner = x * fmaf(x_squared, c * a, c);
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(inner));
  const float slope = x * fmaf(x_squared, 1.5f * c * a, 0.5f * c);
  return fmaf(slope, fmaf(-t, t, 1.f), fmaf(0.5f, t, 0.5f));
}

}  // namespace device
#endif  // WEFT_HOPPER_GEMM_DEVICE

// a [M, K] · b [N, K]ᵀ (kB kNByK) or a [M, K] · b [K, N] (kKByN) → out [M, N] with kEpilogue.
// Persistent: cluster c (of gridDim.x / kCluster; a CTA alone when kCluster is 1) takes tile groups
// c, c + clusters, ... of the [M / (128 · kCluster), N / kBlockN] tile groups, in the order
// origin_of (below) gives them, and each CTA's producer runs ahead into the next tile while its
// consumers finish one. Launched with clusters of kCluster CTAs along x when kCluster > 1. Maps
// (128-byte swizzle): a_map boxes [128 rows, 64], b_map [kBSliceRows rows, 64] (kNByK) or [64 rows,
// 64] (kKByN), out_map and pre_gelu_map [64 rows, 64]. keep_pre_gelu: whether pre_gelu_map's
// matrix is written (kBiasGelu); kGeluBackward reads it (bias unused). kSumAColumns (alternating
// tilings only): A's column sums in 32-row slices, a_column_partials [ceil(M / 32), K] f32, slice s
// column c = Σ a[32s .. 32s + 31, c] (rows past M count as zeros), for a bias gradient that a second
// pass sums over the slices; its rows and columns must be 8-byte aligned (K even). group_rows (at
// least 1): the height of origin_of's bands. Both outputs go through the staging boxes: the
// pre-activation stored from registers in wgmma's fragment layout instead (8 rows of 16 bytes a
// warp's store) measured 35-40% slower.
// kSwiglu (kNByK, one CTA a cluster, kBlockN a multiple of 16): Llama's gate and up products of x
// = a at once. n_size is the hidden width H of the three outputs [M, H]; a tile covers kBlockN / 2
// of their columns, and its B slice is the gate weight's rows (b_map, [H, K], boxes [kBlockN / 2
// rows, 64]) over the up weight's same rows (second_b_map, the same shape), so that accumulator
// columns c and c + kBlockN / 2, gate and up of output column c, sit in one thread (wgmma's
// fragment layout puts column 8j + 2 (lane % 4) + r in every thread of a lane % 4 class). Stored:
// the gate product to pre_gelu_map's matrix, the up product to second_out_map's, silu(gate) · up of
// the two rounded values to out_map's (each [M, H], boxes [64 rows, swiglu_box_columns<T>()]).
// kSwigluBackward (kKByN, one CTA a cluster, kStagingBoxes a multiple of 3, no column sums): SwiGLU's
// backward in the down-projection's dX product. With d = a · b rounded to bf16 (dY · W), g = gate and
// u = up: grad_gate = (d · u) · silu'(g) and grad_up = d · silu(g), each product rounded as
// runtime/cuda/swiglu.cu's swiglu_backward rounds it, so that the outputs are that kernel's bits of
// d. Read: gate from pre_gelu_map's matrix and up from second_pre_map's; stored: grad_gate to
// out_map's and grad_up to second_out_map's (each [M, N], boxes [64 rows, 64]).
// second_b_map, second_out_map and second_pre_map are read only by the epilogues above that name
// them; the others' launches may repeat another map there.
template <typename T, Epilogue kEpilogue, BLayout kB = BLayout::kNByK, bool kSumAColumns = false>
__global__ void __launch_bounds__(T::kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                const __grid_constant__ CUtensorMap out_map, const __grid_constant__ CUtensorMap pre_gelu_map,
                const __grid_constant__ CUtensorMap second_b_map, const __grid_constant__ CUtensorMap second_out_map,
                const __grid_constant__ CUtensorMap second_pre_map, int m_size, int n_size, int k_size,
                const __nv_bfloat16* __restrict__ bias, bool keep_pre_gelu, int group_rows,
                float* __restrict__ a_column_partials) {
#ifdef WEFT_HOPPER_GEMM_DEVICE
  using namespace device;
  static_assert(!kSumAColumns || T::kPingPong, "gemm_kernel: A's column sums are taken by alternating tilings");
  constexpr bool kSwiglu = kEpilogue == Epilogue::kSwiglu;
  static_assert(!kSwiglu || (kB == BLayout::kNByK && T::kCluster == 1 && T::kBlockN % 16 == 0 && !kSumAColumns),
                "gemm_kernel: SwiGLU's products read both weights K-major, one CTA a cluster, into whole "
                "8-row groups of each weight");
  constexpr bool kSwigluBackward = kEpilogue == Epilogue::kSwigluBackward;
  // Each of a round's output boxes takes three staging boxes, and the rounds cover a warpgroup's boxes.
  static_assert(!kSwigluBackward || (kB == BLayout::kKByN && T::kCluster == 1 && !kSumAColumns &&
                                     T::kStagingBoxes % 3 == 0 && T::kBoxes % T::kSwigluBackwardRoundBoxes == 0),
                "gemm_kernel: SwiGLU's backward reads B N-major, one CTA a cluster, without A's column sums, "
                "into triples of staging boxes that divide the warpgroup's output boxes");
  // kSwigluBackward: the output boxes a staging round takes.
  constexpr int kSwigluPositions = kSwigluBackward ? T::kSwigluBackwardRoundBoxes : 1;
  static_assert(kSwiglu || kSwigluBackward || T::kBoxes % T::kStagingBoxes == 0,
                "gemm_kernel: the staging rounds divide the warpgroup's output boxes");
  // The output columns a tile covers: SwiGLU's tiles hold gate and up columns side by side.
  constexpr int kTileColumns = kSwiglu ? T::kBlockN / 2 : T::kBlockN;
  constexpr int kNBoxes = T::kBlockN / 64;  // a stage's B boxes when kB is kKByN
  static_assert(kB == BLayout::kNByK || kNBoxes % T::kCluster == 0,
                "gemm_kernel: an N-major B splits into whole 64-column boxes among the cluster's CTAs");
  extern __shared__ uint8_t shared_raw[];
  // The 128-byte swizzle repeats every 1024 bytes, and wgmma's descriptors assume tiles aligned to it.
  uint8_t* shared = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* staging_all = shared + T::kStages * T::kStageBytes;                               // [kConsumers]
  uint64_t* full = reinterpret_cast<uint64_t*>(staging_all + T::kConsumers * T::kStagingBytes);  // [kStages]
  uint64_t* empty = full + T::kStages;                                                          // [kStages]
  uint64_t* turn = empty + T::kStages;  // [2]: alternating warpgroup g may start its products on turn[g]
  // [kConsumers]: kSwigluBackward's gate and up boxes of a round are in staging
  uint64_t* pre_loaded = turn + 2;
  // [kConsumers][kStagingBoxes]: kGeluBackward's pre-activation box is in this staging box
  uint64_t* slot_loaded = pre_loaded + T::kConsumers;
  // A cluster's tile group: kCluster vertically adjacent tiles, rank r of the cluster taking the
  // r-th (past the last row, its loads are TMA's zeros and its stores are skipped). Without
  // clusters a group is a tile and a CTA its own cluster.
  const int n_tiles = (n_size + kTileColumns - 1) / kTileColumns;
  const int m_groups = ((m_size + T::kBlockM - 1) / T::kBlockM + T::kCluster - 1) / T::kCluster;
  const int tiles = m_groups * n_tiles;  // tile groups
  const int k_blocks = (k_size + T::kBlockK - 1) / T::kBlockK;
  const int cluster = blockIdx.x / T::kCluster, clusters = gridDim.x / T::kCluster;
  const uint32_t rank = T::kCluster > 1 ? cluster_rank() : 0;
  // Where tile group t lies: in bands of group_rows rows of tile groups, swept column by column (a
  // row at a time within each column), so that the CTAs at work together read group_rows rows of A
  // and few columns of B instead of one row of A and every column of B (group_rows 1: row-major).
  auto origin_of = [&](int tile, int& m_start, int& n_start) {
    const int band = tile / (group_rows * n_tiles), within = tile % (group_rows * n_tiles);
    const int band_rows = min(group_rows, m_groups - band * group_rows);
    const int m_group = band * group_rows + within % band_rows;
    m_start = (m_group * T::kCluster + static_cast<int>(rank)) * T::kBlockM;
    n_start = (within / band_rows) * kTileColumns;
  };

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < T::kStages; ++stage) {
      barrier_init(&full[stage], 1);                  // the producer's expect_tx; the bytes complete it
      // One arrival from each warp of the warpgroups that read a stage, in every CTA of the cluster
      // (the stage is loaded into all of them at once).
      barrier_init(&empty[stage], (T::kPingPong ? 4 : 4 * T::kConsumers) * T::kCluster);
    }
    barrier_init(&turn[0], 4);  // one arrival from each warp of the other warpgroup
    barrier_init(&turn[1], 4);
    barrier_init(&pre_loaded[0], 1);  // the warpgroup leader's expect_tx; the bytes complete it
    barrier_init(&pre_loaded[1], 1);
    for (int slot = 0; slot < T::kConsumers * T::kStagingBoxes; ++slot) barrier_init(&slot_loaded[slot], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (T::kCluster > 1) {
    cluster_sync();  // the other CTAs' barriers are initialized before anything reaches them
  } else {
    __syncthreads();
  }
  // Launched as a programmatic dependent (the runtime's launchers), the CTA may be placed while the
  // kernel before it finishes: everything above touches only shared memory, and every global access
  // (loads, stores, the bias) comes after this. Launched the ordinary way, it returns at once.
  wait_for_previous_kernels();
  // A consumer warp is done with a stage: every CTA of the cluster may load it again (lane r
  // tells the CTA of rank r).
  auto release = [&](int stage, int lane) {
    if constexpr (T::kCluster > 1) {
      if (lane < T::kCluster) barrier_arrive_in(&empty[stage], lane);
    } else {
      if (lane == 0) barrier_arrive(&empty[stage]);
    }
  };

  if (threadIdx.x >= T::kConsumerThreads) {  // the producer: one lane issues every load
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == T::kConsumerThreads) {
      int use = 0;  // of the stage ring, over every tile of this CTA
      for (int tile = cluster; tile < tiles; tile += clusters) {
        int m_start, n_start;
        origin_of(tile, m_start, n_start);
        for (int k_block = 0; k_block < k_blocks; ++k_block, ++use) {
          const int stage = use % T::kStages;
          if (use >= T::kStages) barrier_wait(&empty[stage], ((use / T::kStages) - 1) & 1);
          uint8_t* a_tile = shared + stage * T::kStageBytes;
          // The whole stage lands here: A from this CTA's load, B's shares from every CTA's.
          barrier_expect_bytes(&full[stage], T::kStageBytes);
          tma_load(a_tile, &a_map, &full[stage], k_block * T::kBlockK, m_start);
          uint8_t* b_tile = a_tile + T::kATileBytes;
          if constexpr (kB == BLayout::kKByN) {
            // 64-column boxes of 64 k, kNMajorBoxBytes apart; a cluster's CTAs each load a share.
            constexpr int kShare = kNBoxes / T::kCluster;
#pragma unroll
            for (int box = static_cast<int>(rank) * kShare; box < (static_cast<int>(rank) + 1) * kShare; ++box) {
              if constexpr (T::kCluster > 1) {
                tma_load_multicast(b_tile + box * kNMajorBoxBytes, &b_map, &full[stage], n_start + 64 * box,
                                   k_block * T::kBlockK, (1u << T::kCluster) - 1);
              } else {
                tma_load(b_tile + box * kNMajorBoxBytes, &b_map, &full[stage], n_start + 64 * box,
                         k_block * T::kBlockK);
              }
            }
          } else if constexpr (kSwiglu) {
            // The gate weight's rows over the up weight's: kBlockN / 2 rows of 128 bytes each.
            tma_load(b_tile, &b_map, &full[stage], k_block * T::kBlockK, n_start);
            tma_load(b_tile + (T::kBlockN / 2) * 128, &second_b_map, &full[stage], k_block * T::kBlockK, n_start);
          } else if constexpr (T::kCluster > 1) {
            tma_load_multicast(b_tile + rank * T::kBSliceRows * 128, &b_map, &full[stage], k_block * T::kBlockK,
                               n_start + rank * T::kBSliceRows, (1u << T::kCluster) - 1);
          } else {
            tma_load(b_tile, &b_map, &full[stage], k_block * T::kBlockK, n_start);
          }
        }
      }
    }
    // A CTA leaves only once no other CTA of its cluster will load into it or arrive on its barriers.
    if constexpr (T::kCluster > 1) cluster_sync();
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");

  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const bool leader = threadIdx.x % 128 == 0;  // issues this warpgroup's stores
  const int first_half = T::kPingPong ? 0 : group * T::kHalves;  // of the tile's 128 / 64 halves
  uint8_t* staging = staging_all + group * T::kStagingBytes;
  float accumulators[T::kHalves][T::kAccumulators];  // this warpgroup's 64-row halves, wgmma's layout
  // The ring's stages are used in the order the producer loads them: tile by tile of this CTA. An
  // alternating warpgroup takes every kConsumers-th tile, and skips the others' uses.
  // A warpgroup waits on a stage's "full" barrier by the parity of the use it wants. Waiting before
  // the barrier has reached that use's phase would pass at once (the phase in progress has the
  // other parity). So alternating warpgroups take turns: one starts a tile's products once the
  // other has waited on all of its previous tile's (turn), which also keeps their products from
  // interleaving.
  const int tile_step = T::kPingPong ? T::kConsumers : 1;
  int use = T::kPingPong ? group * k_blocks : 0;
  int turns_waited = 0;
  int pre_loads = 0;  // kSwigluBackward: this warpgroup's rounds of loads into staging waited for
  int epilogues_done = 0;  // kGeluBackward: this warpgroup's tiles finished (the slots' phases follow)
  for (int tile = cluster + (T::kPingPong ? group * clusters : 0); tile < tiles;
       tile += tile_step * clusters, use += (tile_step - 1) * k_blocks) {
    if constexpr (T::kPingPong) {
      if (group == 1 || tile != cluster) barrier_wait(&turn[group], turns_waited++ & 1);
    }
    int m_start, n_start;
    origin_of(tile, m_start, n_start);
    // Where box b of this warpgroup's part of the tile lies in the output (and the pre-activation).
    auto box_row = [&](int box) { return m_start + 64 * (first_half + box / (T::kBlockN / 64)); };
    auto box_column = [&](int box) { return n_start + 64 * (box % (T::kBlockN / 64)); };
    // kSwigluBackward: the leader loads a round's kSwigluPositions output boxes, each one's gate box
    // into staging box p and its up box into staging box kSwigluPositions + p (p its place in the
    // round), where its two gradients go (TMA fills zeros past the matrix's edges; those boxes are
    // not stored).
    auto load_pre_activation = [&](int round) {
      if constexpr (kSwigluBackward) {
        constexpr int kPositions = kSwigluPositions;
        barrier_expect_bytes(&pre_loaded[group], 2 * kPositions * 8192);
#pragma unroll
        for (int box = round * kPositions; box < (round + 1) * kPositions; ++box) {
          uint8_t* const gate_box = staging + (box % kPositions) * 8192;
          tma_load(gate_box, &pre_gelu_map, &pre_loaded[group], box_column(box), box_row(box));
          tma_load(gate_box + kPositions * 8192, &second_pre_map, &pre_loaded[group], box_column(box), box_row(box));
        }
      }
    };
    // kGeluBackward: the leader loads output box `box`'s pre-activation into staging box
    // box % kStagingBoxes, where the epilogue reads each value from the place its result goes.
    auto load_pre_activation_box = [&](int box) {
      const int slot = box % T::kStagingBoxes;
      uint64_t* const loaded = &slot_loaded[group * T::kStagingBoxes + slot];
      barrier_expect_bytes(loaded, 8192);
      tma_load(staging + slot * 8192, &pre_gelu_map, loaded, box_column(box), box_row(box));
    };
    if constexpr (kEpilogue == Epilogue::kGeluBackward || kSwigluBackward) {
      // The first boxes load under the products, once the last tile's stores have read them. (The
      // later boxes fetched into L2 here as well, with TMA's prefetch, made the products slower:
      // Llama 1B's SwiGLU backward 703 against 597 µs, and GPT-2's GELU backward, with the cheaper
      // derivative in the same build, 168 against 161; docs/performance.md, 2026-12-06,
      // twenty-fourth session.)
      if (leader) {
        tma_store_wait_read();
        if constexpr (kSwigluBackward) {
          load_pre_activation(0);
        } else {
#pragma unroll
          for (int box = 0; box < T::kStagingBoxes && box < T::kBoxes; ++box) load_pre_activation_box(box);
        }
      }
    }
#pragma unroll
    for (int half = 0; half < T::kHalves; ++half)
#pragma unroll
      for (int i = 0; i < T::kAccumulators; ++i) accumulators[half][i] = 0.f;

    for (int k_block = 0; k_block < k_blocks; ++k_block, ++use) {
      const int stage = use % T::kStages;
      barrier_wait(&full[stage], (use / T::kStages) & 1);
      const uint8_t* a_tile = shared + stage * T::kStageBytes;
      const uint64_t b_all = kB == BLayout::kNByK ? operand_descriptor(a_tile + T::kATileBytes)
                                                  : n_major_descriptor(a_tile + T::kATileBytes);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < T::kBlockK / 16; ++k) {
#pragma unroll
        for (int half = 0; half < T::kHalves; ++half) {
          // 64 rows of 128 bytes per half; 16 columns of bf16 are 32 bytes along the swizzled row,
          // 2 in the descriptor's address field. N-major B: 16 k are 16 rows of 128 bytes, 128.
          const uint64_t a_half = operand_descriptor(a_tile + (first_half + half) * 64 * 128);
          wgmma_tile<T::kAccumulators, kB == BLayout::kKByN ? 1 : 0>(
              accumulators[half], a_half + 2 * k, b_all + (kB == BLayout::kKByN ? 128 : 2) * k);
        }
      }
      wgmma_commit();
      if constexpr (kSumAColumns) {
        // While the products run: this slice's column sums of A, if this tile's column of tiles is
        // the one that takes this slice (k_block mod the columns of tiles), so that each slice of
        // each row of tiles is summed once and the work spreads evenly over the tiles. Warp w sums
        // the tile's rows 32w..32w+31 for columns 2·lane and 2·lane + 1 (one 128-byte row a load).
        // This costs GPT-2's fc and qkv dX products about 18-20 µs each; taken instead on the tensor
        // cores (eight m64n8k16 of the slice read transposed, times ones) or by the producer
        // warpgroup's three idle warps, the sums cost those products 60-80 and 33-45 µs
        // (docs/performance.md, thirty-second session, which has how each was built).
        const int n_tiles_across = (n_size + T::kBlockN - 1) / T::kBlockN;
        if (k_block % n_tiles_across == n_start / T::kBlockN) {
          float first = 0.f, second = 0.f;
#pragma unroll 8
          for (int r = 0; r < 32; ++r) {
            const __nv_bfloat162 pair = load_shared(swizzled(a_tile, 32 * warp + r, 2 * lane));
            first += __low2float(pair);
            second += __high2float(pair);
          }
          const int slice = m_start / 32 + warp, column = k_block * T::kBlockK + 2 * lane;
          if (m_start + 32 * warp < m_size && column < k_size) {  // K is even: both columns are in A
            *reinterpret_cast<float2*>(a_column_partials + static_cast<int64_t>(slice) * k_size + column) =
                make_float2(first, second);
          }
        }
      }
      wgmma_wait<1>();  // the previous slice's products are done: its stage may be loaded again
      if (k_block > 0) release((use - 1) % T::kStages, lane);
    }
    if constexpr (T::kPingPong) {
      if (lane == 0) barrier_arrive(&turn[1 - group]);
    }
    wgmma_wait<0>();
    release((use - 1) % T::kStages, lane);  // the tile's last slice
#pragma unroll
    for (int half = 0; half < T::kHalves; ++half) fence_registers(accumulators[half]);

    // The epilogue: values into the staging boxes, then TMA stores them. Fragment layout of
    // m64nNk16's f32 accumulators: value 4c + r of a thread sits at row 16·warp + lane/4 + 8·(r/2)
    // and column 8c + 2·(lane%4) + r%2 of the 64-row half; in a box it goes where swizzled says.
    auto stage_and_store = [&](const CUtensorMap* map, auto value_of) {
#pragma unroll
      for (int round = 0; round < T::kBoxes / T::kStagingBoxes; ++round) {
        if (leader) tma_store_wait_read();  // the staging boxes' previous stores have read them
        warpgroup_sync(group);
        // Where value pair `pair` of column group c (8 columns) of a half goes: its staging box (of
        // the tile's), and the slot in the staging boxes.
        auto box_of = [&](int half, int c) { return half * (T::kBlockN / 64) + (8 * c + 2 * (lane % 4)) / 64; };
        auto slot_of = [&](int half, int c, int pair) {
          const int column = 8 * c + 2 * (lane % 4), row = 16 * warp + lane / 4 + 8 * pair;
          return swizzled(staging + (box_of(half, c) % T::kStagingBoxes) * 8192, row, column % 64);
        };
#pragma unroll
        for (int half = 0; half < T::kHalves; ++half) {
#pragma unroll
          for (int c = 0; c < T::kBlockN / 8; ++c) {
            if (box_of(half, c) / T::kStagingBoxes != round) continue;  // known at compile time once unrolled
#pragma unroll
            for (int pair = 0; pair < 2; ++pair) {
              store_shared(slot_of(half, c, pair),
                           value_of(accumulators[half][4 * c + 2 * pair], accumulators[half][4 * c + 2 * pair + 1]));
            }
          }
        }
        fence_for_tma();
        warpgroup_sync(group);
        if (leader) {
#pragma unroll
          for (int box = round * T::kStagingBoxes; box < (round + 1) * T::kStagingBoxes; ++box) {
            const int row_start = box_row(box), column_start = box_column(box);
            if (column_start < n_size && row_start < m_size) {
              tma_store(map, staging + (box % T::kStagingBoxes) * 8192, column_start, row_start);
            }
          }
          tma_store_commit();
        }
      }
    };
    // SwiGLU's three outputs: this warpgroup's boxes of the gate product, then the up product's, then
    // silu(gate) · up's, staged kStagingBoxes at a time (each round waiting until TMA has read the
    // round before). Output column c of the tile (below kTileColumns) has its gate value in column
    // group c / 8 and its up value in column group c / 8 + kGroups of the same thread.
    auto store_swiglu = [&] {
      constexpr int kGroups = kTileColumns / 8;  // an output's 8-column groups in a half
      // swiglu_box_columns: 128-byte swizzled 64-column boxes, or one unswizzled box across a half.
      constexpr int kBoxColumns = swiglu_box_columns<T>();
      constexpr bool kSwizzled = kBoxColumns == 64;
      constexpr int kBoxBytes = 64 * kBoxColumns * 2;
      constexpr int kBoxesAcross = kTileColumns / kBoxColumns;  // an output's boxes across a half
      constexpr int kOutputBoxes = T::kHalves * kBoxesAcross;   // one output's boxes of this warpgroup
      constexpr int kRoundBoxes = T::kStagingBytes / kBoxBytes;  // boxes the staging holds at once
      static_assert(kRoundBoxes > 0, "store_swiglu: the staging holds a box");
      constexpr int kRounds = (3 * kOutputBoxes + kRoundBoxes - 1) / kRoundBoxes;
      const CUtensorMap* const maps[3] = {&pre_gelu_map, &second_out_map, &out_map};
#pragma unroll
      for (int round = 0; round < kRounds; ++round) {
        if (leader) tma_store_wait_read();
        warpgroup_sync(group);
#pragma unroll
        for (int half = 0; half < T::kHalves; ++half) {
#pragma unroll
          for (int c = 0; c < kGroups; ++c) {
            const int column = 8 * c + 2 * (lane % 4);
#pragma unroll
            for (int pair = 0; pair < 2; ++pair) {
              const int row = 16 * warp + lane / 4 + 8 * pair;
              const __nv_bfloat162 gate = __floats2bfloat162_rn(accumulators[half][4 * c + 2 * pair],
                                                                accumulators[half][4 * c + 2 * pair + 1]);
              const __nv_bfloat162 up = __floats2bfloat162_rn(accumulators[half][4 * (c + kGroups) + 2 * pair],
                                                              accumulators[half][4 * (c + kGroups) + 2 * pair + 1]);
              const int offset = kSwizzled ? swizzled_offset(row, column % 64) : row * kBoxColumns * 2 + column * 2;
#pragma unroll
              for (int output = 0; output < 3; ++output) {
                const int box = output * kOutputBoxes + half * kBoxesAcross + column / kBoxColumns;
                if (box / kRoundBoxes != round) continue;  // known at compile time once unrolled
                __nv_bfloat162 value = gate;
                if (output == 1) value = up;
                if (output == 2) {
                  value = __floats2bfloat162_rn(swiglu_value(__low2float(gate), __low2float(up)),
                                                swiglu_value(__high2float(gate), __high2float(up)));
                }
                store_shared(staging + (box % kRoundBoxes) * kBoxBytes + offset, value);
              }
            }
          }
        }
        fence_for_tma();
        warpgroup_sync(group);
        if (leader) {
#pragma unroll
          for (int box = round * kRoundBoxes; box < (round + 1) * kRoundBoxes && box < 3 * kOutputBoxes; ++box) {
            const int within = box % kOutputBoxes;
            const int row_start = m_start + 64 * (first_half + within / kBoxesAcross);
            const int column_start = n_start + kBoxColumns * (within % kBoxesAcross);
            if (column_start < n_size && row_start < m_size) {
              tma_store(maps[box / kOutputBoxes], staging + (box % kRoundBoxes) * kBoxBytes, column_start, row_start);
            }
          }
          tma_store_commit();
        }
      }
    };
    // SwiGLU's backward: kSwigluPositions of this warpgroup's output boxes a round, in the order
    // box_row and box_column number them. Output box b's gate and up boxes are in staging boxes
    // p = b % kSwigluPositions and kSwigluPositions + p (load_pre_activation: the first round's loaded
    // at the tile's start, each later one's once the round before has been read by its stores), and
    // the product d goes, from the accumulators' fragment layout, to staging box 2 kSwigluPositions + p
    // in the same swizzled layout, so that one offset names the same element in all three. The math
    // then runs over the round's 16-byte chunks, a chunk a thread at a time, in a loop that is not
    // unrolled: written per accumulator in wgmma's layout (the epilogues above), 192 columns' worth
    // of it came to more code than the instruction cache holds beside the other warpgroup's products
    // (Nsight Compute: 7 cycles an instruction waiting for instructions). This warpgroup's one warp a
    // scheduler must finish it within the other warpgroup's products, which is why silu.cuh's sigmoid
    // is cheap. Each thread writes its chunk's gradients over the gate and up it read, grad_gate over
    // gate and grad_up over up.
    auto store_swiglu_backward = [&] {
      if constexpr (kSwigluBackward) {  // (compiled only where its tiling's staging fits)
        constexpr int kPositions = kSwigluPositions;
        constexpr int kBoxesAcross = T::kBlockN / 64;  // 64-column boxes in a half
        constexpr int kChunks = 8192 / 16;             // 16-byte chunks in a box
        // d, the product rounded to bf16, for every value up front: half the registers of the f32
        // accumulators. Pair j of a half: values 2j and 2j + 1.
        uint32_t products[T::kHalves][T::kAccumulators / 2];
#pragma unroll
        for (int half = 0; half < T::kHalves; ++half) {
#pragma unroll
          for (int j = 0; j < T::kAccumulators / 2; ++j) {
            products[half][j] = bf16_pair_bits(accumulators[half][2 * j], accumulators[half][2 * j + 1]);
          }
        }
        const int thread = threadIdx.x % 128;
#pragma unroll 1
        for (int round = 0; round < T::kBoxes / kPositions; ++round) {
          if (leader) {
            tma_store_wait_read();  // the staging boxes' previous stores have read them
            if (round > 0) load_pre_activation(round);
          }
          // This round's d into its product boxes while the loads fly. Every box's code is here once
          // (the indices into products must be known at compile time); the round picks its boxes. The
          // round before's math has read these boxes: its threads all passed the sync before its stores.
#pragma unroll
          for (int box = 0; box < T::kBoxes; ++box) {
            if (box / kPositions != round) continue;
            const int half = box / kBoxesAcross, first_group = 8 * (box % kBoxesAcross);  // column groups of 8
            uint8_t* const product_box = staging + (2 * kPositions + box % kPositions) * 8192;
#pragma unroll
            for (int c = first_group; c < first_group + 8; ++c) {
#pragma unroll
              for (int pair = 0; pair < 2; ++pair) {
                const int column = 8 * c + 2 * (lane % 4), row = 16 * warp + lane / 4 + 8 * pair;
                store_shared_bits(swizzled(product_box, row, column % 64), products[half][2 * c + pair]);
              }
            }
          }
          warpgroup_sync(group);  // every thread's d is in place
          barrier_wait(&pre_loaded[group], pre_loads++ & 1);
#pragma unroll 1
          for (int chunk = thread; chunk < kPositions * kChunks; chunk += 128) {
            uint8_t* const gate_box = staging + (chunk / kChunks) * 8192 + (chunk % kChunks) * 16;
            uint8_t* const up_box = gate_box + kPositions * 8192;
            const uint4 gates = load_shared_chunk(gate_box), ups = load_shared_chunk(up_box);
            const uint4 products_chunk = load_shared_chunk(gate_box + 2 * kPositions * 8192);
            const uint32_t gate_words[4] = {gates.x, gates.y, gates.z, gates.w};
            const uint32_t up_words[4] = {ups.x, ups.y, ups.z, ups.w};
            const uint32_t product_words[4] = {products_chunk.x, products_chunk.y, products_chunk.z, products_chunk.w};
            uint32_t grad_gate_words[4], grad_up_words[4];
#pragma unroll
            for (int word = 0; word < 4; ++word) {
              float grad_gate[2], grad_up[2];
#pragma unroll
              for (int i = 0; i < 2; ++i) {  // the low bf16 (the even column), then the high
                const auto value = [&](uint32_t bits) {
                  return __uint_as_float(i == 0 ? bits << 16 : bits & 0xFFFF0000u);
                };
                swiglu_gradients(value(gate_words[word]), value(up_words[word]), value(product_words[word]),
                                 grad_gate[i], grad_up[i]);
              }
              grad_gate_words[word] = bf16_pair_bits(grad_gate[0], grad_gate[1]);
              grad_up_words[word] = bf16_pair_bits(grad_up[0], grad_up[1]);
            }
            store_shared_chunk(gate_box, make_uint4(grad_gate_words[0], grad_gate_words[1], grad_gate_words[2],
                                                    grad_gate_words[3]));
            store_shared_chunk(up_box,
                               make_uint4(grad_up_words[0], grad_up_words[1], grad_up_words[2], grad_up_words[3]));
          }
          fence_for_tma();
          warpgroup_sync(group);
          if (leader) {  // this round's boxes (as load_pre_activation takes them)
#pragma unroll
            for (int box = round * kPositions; box < (round + 1) * kPositions; ++box) {
              const int row_start = box_row(box), column_start = box_column(box);
              if (column_start < n_size && row_start < m_size) {
                uint8_t* const gate_box = staging + (box % kPositions) * 8192;
                tma_store(&out_map, gate_box, column_start, row_start);
                tma_store(&second_out_map, gate_box + kPositions * 8192, column_start, row_start);
              }
            }
            tma_store_commit();
          }
        }
      }
    };
    const auto rounded = [](float first, float second) { return __floats2bfloat162_rn(first, second); };
    // GELU's backward, box by box through a ring of the staging boxes: output box b's pre-activation
    // is loaded into staging box b % kStagingBoxes (the first kStagingBoxes at the tile's start,
    // under the products; each later one as soon as the store of the box before it in that staging
    // box has read it), each result is written over the value it came from, and each box is stored
    // at once. A box's load then flies while the boxes before it are computed, where a round of
    // boxes used to wait for the round before's stores to be read and then for its own loads.
    auto store_gelu_backward = [&] {
      constexpr int kSlots = T::kStagingBoxes;
      static_assert(kSlots >= 2, "gemm_kernel: GELU's backward reloads a staging box while the next one is stored");
      constexpr int kBoxesAcross = T::kBlockN / 64;  // 64-column boxes in a half
#pragma unroll
      for (int box = 0; box < T::kBoxes; ++box) {
        const int slot = box % kSlots;
        const int slot_uses = (T::kBoxes - slot + kSlots - 1) / kSlots;  // a tile's loads into this slot
        barrier_wait(&slot_loaded[group * kSlots + slot], (epilogues_done * slot_uses + box / kSlots) & 1);
        uint8_t* const slot_box = staging + slot * 8192;
        const int half = box / kBoxesAcross, first_c = 8 * (box % kBoxesAcross);  // column groups of 8
        // Four column groups' pre-activations at a time, read before any is used, so that the reads
        // overlap (all eight at once spilled in the product without A's column sums).
#pragma unroll
        for (int batch = 0; batch < 8; batch += 4) {
          __nv_bfloat162 pre[4][2];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int pair = 0; pair < 2; ++pair) {
              pre[c][pair] =
                  load_shared(swizzled(slot_box, 16 * warp + lane / 4 + 8 * pair, 8 * (batch + c) + 2 * (lane % 4)));
            }
          }
#pragma unroll
          for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int pair = 0; pair < 2; ++pair) {
              const float first = accumulators[half][4 * (first_c + batch + c) + 2 * pair];
              const float second = accumulators[half][4 * (first_c + batch + c) + 2 * pair + 1];
              store_shared(swizzled(slot_box, 16 * warp + lane / 4 + 8 * pair, 8 * (batch + c) + 2 * (lane % 4)),
                           __floats2bfloat162_rn(first * gelu_tanh_derivative(__low2float(pre[c][pair])),
                                                 second * gelu_tanh_derivative(__high2float(pre[c][pair]))));
            }
          }
        }
        fence_for_tma();
        warpgroup_sync(group);
        if (leader) {
          const int row_start = box_row(box), column_start = box_column(box);
          if (column_start < n_size && row_start < m_size) tma_store(&out_map, slot_box, column_start, row_start);
          tma_store_commit();
          // Box - 1's staging box is free once its store has read it (this box's may still be
          // reading); the box kSlots after it loads there.
          const int next = box - 1 + kSlots;
          if (box >= 1 && next < T::kBoxes) {
            tma_store_wait_read_all_but<1>();
            load_pre_activation_box(next);
          }
        }
      }
      ++epilogues_done;
    };
    if constexpr (kEpilogue == Epilogue::kBias || kEpilogue == Epilogue::kBiasGelu) {
      // The bias into the accumulators once: a pair of columns a column group, the same for both
      // halves and both rows of a fragment.
#pragma unroll
      for (int c = 0; c < T::kBlockN / 8; ++c) {
        const int column = n_start + 8 * c + 2 * (lane % 4);
        if (column < n_size) {
          const __nv_bfloat162 bias_pair = *reinterpret_cast<const __nv_bfloat162*>(bias + column);
          const float low = __bfloat162float(bias_pair.x), high = __bfloat162float(bias_pair.y);
#pragma unroll
          for (int half = 0; half < T::kHalves; ++half) {
            accumulators[half][4 * c] += low;
            accumulators[half][4 * c + 1] += high;
            accumulators[half][4 * c + 2] += low;
            accumulators[half][4 * c + 3] += high;
          }
        }
      }
    }
    if constexpr (kEpilogue == Epilogue::kBiasGelu) {
      // The pre-activation staged and stored, then GELU over the accumulators in place before the
      // output's staging round: the arithmetic runs while TMA reads the pre-activation's boxes,
      // which the output's round waits for (with every box of a warpgroup staged at once, the
      // alternating 128-column tiling, that wait came first and the arithmetic after it).
      if (keep_pre_gelu) stage_and_store(&pre_gelu_map, rounded);
#pragma unroll
      for (int half = 0; half < T::kHalves; ++half) {
#pragma unroll
        for (int i = 0; i < T::kAccumulators; ++i) accumulators[half][i] = gelu_tanh(accumulators[half][i]);
        fence_registers(accumulators[half]);  // computed here, ahead of the round's wait
      }
      stage_and_store(&out_map, rounded);
    } else if constexpr (kSwiglu) {
      store_swiglu();
    } else if constexpr (kSwigluBackward) {
      store_swiglu_backward();
    } else if constexpr (kEpilogue == Epilogue::kGeluBackward) {
      store_gelu_backward();
    } else {
      stage_and_store(&out_map, rounded);  // kNone, or kBias with the bias added above
    }
  }
  if (leader) tma_store_wait_all();  // the staging boxes stay valid until every store has read them
  if constexpr (T::kCluster > 1) cluster_sync();
#endif  // WEFT_HOPPER_GEMM_DEVICE
}

}  // namespace weft::cuda::hopper
