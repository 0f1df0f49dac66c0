// Multi-tensor AdamW and SGD behind CudaBackend::adamw_update and sgd_update.
// runtime/optimizer_update.h states the math and the master-weight rule; these kernels follow them
// exactly as the CPU loops of runtime/cpu/optimizer_update.cc do, in f32, with each per-parameter
// scalar rounded once to f32 on the host. One slot per parameter in a multi_tensor_table.cuh
// table; each block updates one chunk of 64K elements, so one launch covers a whole model whatever
// the parameter sizes. AdamW moves sixteen elements a thread (two 8-element accesses per array) or
// four where a parameter's arrays allow (multi_tensor_table.cuh: eight_aligned, four_aligned), with
// per-element arithmetic unchanged. Parameters are f32, bf16 or f16; gradients f32, bf16 or f16
// (read as they are, not converted); state is f32; masters are i16 low halves for bf16 parameters
// (runtime/split_master_weights.h), f32 for f16.
#include "runtime/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cuda/bulk_copy.cuh"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/dynamic_shared_memory.cuh"
#include "runtime/cuda/multi_tensor_table.cuh"
#include "runtime/cuda/optimizer_kernels.h"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"
#include "runtime/split_master_weights.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kThreads = 512;

// How a parameter's master is stored (optim/master_weights.h).
enum MasterKind : int32_t { kNoMaster = 0, kMasterF32 = 1, kMasterLowHalves = 2 };

struct TensorSlot {
  void* parameter;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* master;  // float* (kMasterF32), int16_t* (kMasterLowHalves), null (kNoMaster)
  int64_t numel;
  float step_size;
  float bias_correction2_sqrt;
  float decay;
  float step_size_if_previous_skipped;  // count t - 1's, where the previous guard is not finite
  float bias_correction2_sqrt_if_previous_skipped;
  int32_t parameter_kind;
  int32_t grad_kind;
  int32_t vector_width;  // elements a thread moves per step: 16 (every array aligned to 8 elements:
                         // two 8-element accesses), 4 (aligned to 4), 1 (one at a time)
  int32_t master_kind;   // MasterKind
};

// The value an update starts from (runtime/optimizer_update.h's master-weight rule, as
// load_parameter_value does in runtime/cpu/optimizer_update.cc). `stored` is the parameter's value;
// `kept` the f32 master's (kMasterF32), `low` the low half (kMasterLowHalves). A bf16 parameter
// and its low half make the f32 value; an f16 parameter whose f32 master no longer rounds to it was
// written from outside, and the stored value wins.
__device__ __forceinline__ float starting_value(float stored, float kept, int16_t low, int32_t master_kind) {
  switch (master_kind) {
    case kMasterLowHalves:
      return __uint_as_float(master_bits(static_cast<uint16_t>(__float_as_uint(stored) >> 16), low));
    case kMasterF32: {
      const float rounded = __half2float(__float2half_rn(kept));
      return (rounded == stored || (isnan(rounded) && isnan(stored))) ? kept : stored;
    }
    default: return stored;
  }
}

// The value the parameter gets for an updated `value`: for low halves the high half, as an f32 that
// store_kind's rounding keeps exactly (ties away from zero, not to even: split_master_weights.h);
// otherwise `value`, which store_kind rounds to nearest even.
__device__ __forceinline__ float parameter_value(float value, int32_t master_kind) {
  if (master_kind != kMasterLowHalves) return value;
  return __uint_as_float(static_cast<uint32_t>(master_high_half(__float_as_uint(value))) << 16);
}

// Whether the step goes ahead: no guard, or a finite one (optimizer_update.h). Read by every block,
// so a skipped step costs one load per block and no host read.
__device__ __forceinline__ bool guard_allows(const float* guard) { return guard == nullptr || isfinite(*guard); }

struct AdamWConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
};

// One element's AdamW step: updates m and v in place and returns the new parameter value.
__device__ __forceinline__ float adamw_step(float value, float g, float& m, float& v, const TensorSlot& slot,
                                            const AdamWConstants& c) {
  value = value * slot.decay;
  m = m * c.beta1 + g * c.one_minus_beta1;
  v = v * c.beta2 + g * g * c.one_minus_beta2;
  const float denominator = sqrtf(v) / slot.bias_correction2_sqrt + c.eps;
  return value - slot.step_size * (m / denominator);
}

// Element i's master, read (into `kept` or `low`) and written, for each MasterKind.
__device__ __forceinline__ void load_master(const void* master, int32_t master_kind, int64_t i, float& kept,
                                            int16_t& low) {
  if (master_kind == kMasterF32) kept = static_cast<const float*>(master)[i];
  if (master_kind == kMasterLowHalves) low = static_cast<const int16_t*>(master)[i];
}
__device__ __forceinline__ void store_master(void* master, int32_t master_kind, int64_t i, float value) {
  if (master_kind == kMasterF32) static_cast<float*>(master)[i] = value;
  if (master_kind == kMasterLowHalves) static_cast<int16_t*>(master)[i] = master_low_half(__float_as_uint(value));
}

// Element i alone (tails, and tensors not aligned to four elements).
__device__ __forceinline__ void adamw_one(const TensorSlot& slot, int64_t i, const AdamWConstants& c, float scale) {
  const float stored = load_kind(slot.parameter, slot.parameter_kind, i);
  float kept = 0.0f;
  int16_t low = 0;
  load_master(slot.master, slot.master_kind, i, kept, low);
  float value = starting_value(stored, kept, low, slot.master_kind);
  float m = slot.exp_avg[i], v = slot.exp_avg_sq[i];
  value = adamw_step(value, load_kind(slot.grad, slot.grad_kind, i) * scale, m, v, slot, c);
  slot.exp_avg[i] = m;
  slot.exp_avg_sq[i] = v;
  store_master(slot.master, slot.master_kind, i, value);
  store_kind(slot.parameter, slot.parameter_kind, i, parameter_value(value, slot.master_kind));
}

// Where adamw_vector reads its operands: the slot's own arrays (global memory), or a copy of a run
// of them in shared memory (adamw_bulk_kernel). Element `at` of each is element i of the slot's.
struct AdamWSources {
  const void* parameter;
  const void* master;  // as TensorSlot::master
  const void* grad;
  const float* exp_avg;
  const float* exp_avg_sq;
  int64_t at;
};

__device__ __forceinline__ AdamWSources global_sources(const TensorSlot& slot, int64_t i) {
  return {slot.parameter, slot.master, slot.grad, slot.exp_avg, slot.exp_avg_sq, i};
}

// Elements i .. i + kWidth - 1 of a slot whose arrays are all aligned to 4 elements (kWidth 4: one
// access per array) or to 8 (kWidth a multiple of 8: one 8-element access per 8), and per element
// exactly adamw_one's arithmetic. Operands are read from `from` (aligned likewise at from.at),
// results written to the slot's arrays.
template <int kWidth>
__device__ __forceinline__ void adamw_vector(const TensorSlot& slot, const AdamWSources& from, int64_t i,
                                             const AdamWConstants& c, float scale) {
  static_assert(kWidth == 4 || kWidth % 8 == 0, "four elements, or eight at a time");
  const auto load = [](const void* base, int32_t kind, int64_t at, float* out) {
    if constexpr (kWidth == 4) {
      load4_kind(base, kind, at, out);
    } else {
#pragma unroll
      for (int h = 0; h < kWidth; h += 8) load8_kind(base, kind, at + h, out + h);
    }
  };
  const auto store = [](void* base, int32_t kind, int64_t at, const float* value) {
    if constexpr (kWidth == 4) {
      store4_kind(base, kind, at, value);
    } else {
#pragma unroll
      for (int h = 0; h < kWidth; h += 8) store8_kind(base, kind, at + h, value + h);
    }
  };
  float stored[kWidth], kept[kWidth], g[kWidth], m[kWidth], v[kWidth], value[kWidth], rounded[kWidth];
  int16_t lows[kWidth];
#pragma unroll
  for (int j = 0; j < kWidth; ++j) kept[j] = 0.0f, lows[j] = 0;
  load(from.parameter, slot.parameter_kind, from.at, stored);
  if (slot.master_kind == kMasterF32) load(from.master, kStorageF32, from.at, kept);
  if (slot.master_kind == kMasterLowHalves) {
    // kWidth i16 halves: one 8-byte word (kWidth 4), or one 16-byte word per eight.
    const int16_t* low = static_cast<const int16_t*>(from.master) + from.at;
    if constexpr (kWidth == 4) {
      const short4 word = *reinterpret_cast<const short4*>(low);
      lows[0] = word.x, lows[1] = word.y, lows[2] = word.z, lows[3] = word.w;
    } else {
#pragma unroll
      for (int h = 0; h < kWidth; h += 8) {
        const uint4 word = *reinterpret_cast<const uint4*>(low + h);
        const uint32_t words[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          lows[h + 2 * w] = static_cast<int16_t>(words[w] & 0xffffu);
          lows[h + 2 * w + 1] = static_cast<int16_t>(words[w] >> 16);
        }
      }
    }
  }
  load(from.grad, slot.grad_kind, from.at, g);
#pragma unroll
  for (int j = 0; j < kWidth; ++j) g[j] *= scale;
  load(from.exp_avg, kStorageF32, from.at, m);
  load(from.exp_avg_sq, kStorageF32, from.at, v);
#pragma unroll
  for (int j = 0; j < kWidth; ++j) {
    value[j] = adamw_step(starting_value(stored[j], kept[j], lows[j], slot.master_kind), g[j], m[j], v[j], slot, c);
    rounded[j] = parameter_value(value[j], slot.master_kind);
  }
  store(slot.exp_avg, kStorageF32, i, m);
  store(slot.exp_avg_sq, kStorageF32, i, v);
  if (slot.master_kind == kMasterF32) store(slot.master, kStorageF32, i, value);
  if (slot.master_kind == kMasterLowHalves) {
    uint16_t halves[kWidth];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) halves[j] = static_cast<uint16_t>(master_low_half(__float_as_uint(value[j])));
    int16_t* low = static_cast<int16_t*>(slot.master) + i;
    if constexpr (kWidth == 4) {
      *reinterpret_cast<short4*>(low) = make_short4(static_cast<short>(halves[0]), static_cast<short>(halves[1]),
                                                    static_cast<short>(halves[2]), static_cast<short>(halves[3]));
    } else {
#pragma unroll
      for (int h = 0; h < kWidth; h += 8) {
        const uint16_t* half = halves + h;
        *reinterpret_cast<uint4*>(low + h) =
            make_uint4(half[0] | (uint32_t{half[1]} << 16), half[2] | (uint32_t{half[3]} << 16),
                       half[4] | (uint32_t{half[5]} << 16), half[6] | (uint32_t{half[7]} << 16));
      }
    }
  }
  store(slot.parameter, slot.parameter_kind, i, rounded);
}

// A slot with the scalars of this step: those of count t - 1 where the step in flight before this
// one was skipped (its guard, previous_guard, is not finite; runtime/optimizer_update.h).
__device__ __forceinline__ TensorSlot slot_for_step(TensorSlot slot, const float* previous_guard) {
  if (!guard_allows(previous_guard)) {
    slot.step_size = slot.step_size_if_previous_skipped;
    slot.bias_correction2_sqrt = slot.bias_correction2_sqrt_if_previous_skipped;
  }
  return slot;
}

// gradient_scale: null, or the factor every gradient is multiplied by as it is read.
// previous_guard: null, or the guard of the step in flight before this one; where it is not finite
// that step was skipped and the scalars of count t - 1 apply (runtime/optimizer_update.h).
__global__ void adamw_chunks_kernel(const TensorSlot* tensors, const ChunkSlot* chunks, AdamWConstants constants,
                                    const float* guard, const float* gradient_scale, const float* previous_guard) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  if (!guard_allows(guard)) return;
  const float scale = gradient_scale != nullptr ? *gradient_scale : 1.0f;
  const ChunkSlot chunk = chunks[blockIdx.x];
  const TensorSlot slot = slot_for_step(tensors[chunk.tensor], previous_guard);
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  int64_t scalar_start = chunk.start;
  // Chunks start at multiples of kChunkElements, so a thread stepping by the width stays aligned.
  const int width = slot.vector_width;
  if (width > 1) {
    const int64_t vector_end = chunk.start + (end - chunk.start) / width * width;
    const int64_t stride = static_cast<int64_t>(width) * blockDim.x;
    for (int64_t i = chunk.start + width * static_cast<int64_t>(threadIdx.x); i < vector_end; i += stride) {
      if (width == 16) {
        adamw_vector<16>(slot, global_sources(slot, i), i, constants, scale);
      } else {
        adamw_vector<4>(slot, global_sources(slot, i), i, constants, scale);
      }
    }
    scalar_start = vector_end;
  }
  for (int64_t i = scalar_start + threadIdx.x; i < end; i += blockDim.x) adamw_one(slot, i, constants, scale);
}

// adamw_chunks_kernel's work on Hopper, where the copy engine brings in the operands. A thread of
// adamw_chunks_kernel holds its sixteen elements' five operands in registers (128 of them, so one
// block of 512 threads a multiprocessor) and loads nothing while it computes and stores: 80% of the
// H200's copy bandwidth (docs/performance.md, 2026-12-04). Here one block a multiprocessor keeps
// kBulkStages tiles of kBulkTileElements elements in shared memory: thread 0 has each tile's runs
// of the parameter, its master, the gradient and both moments copied in (bulk_copy.cuh, one
// barrier a stage) kBulkStages - 1 tiles ahead of the one the block computes, and the threads write
// their results straight to global memory. A stage is loaded again only after the whole block has
// read it (a __syncthreads, then a proxy fence). Each chunk of the table stands for
// kBulkTilesPerChunk tiles, those past its tensor's end empty; block b takes tiles b, b + grid, ...
// of that sequence, so blocks get about the same number of tiles whatever the tensors' sizes.
// Every slot's arrays are aligned to 8 elements (vector_width 16: the launch checks it), so a tile's
// first multiple of 8 elements comes in by bulk copies (16-byte runs) and its last few, if any, are
// read where they are (adamw_one).
constexpr int kBulkThreads = 512;
constexpr int kBulkTileElements = 4 * kBulkThreads;  // four elements a thread
constexpr int kBulkTilesPerChunk = static_cast<int>(kChunkElements / kBulkTileElements);
// Five stages: a bf16 model's tile fills 28 KB of a stage's 40 (the regions are sized for f32), so
// the four tiles in flight keep about 110 KB a multiprocessor coming, some 15 MB over an H200,
// beyond what its memory's latency times its bandwidth asks (a few MB).
constexpr int kBulkStages = 5;
constexpr int kBulkArrays = 5;                                  // parameter, master, gradient, m, v
constexpr int kBulkRegionBytes = 4 * kBulkTileElements;         // an array's run in a stage, f32 at most
constexpr int kBulkStageBytes = kBulkArrays * kBulkRegionBytes;  // 40 KB
constexpr int kBulkSharedBytes = kBulkStages * kBulkStageBytes;  // 200 KB
static_assert(kChunkElements % kBulkTileElements == 0, "a chunk is whole tiles");
static_assert(kBulkSharedBytes + 1024 <= 227 * 1024, "the stages fit in an H100/H200 block");

// The elements of tile `tile` of the block's sequence: tensor, first element, count (0: past its
// tensor's end, an empty tile).
struct BulkTile {
  int64_t tensor = 0;
  int64_t start = 0;
  int count = 0;
};

__device__ __forceinline__ BulkTile bulk_tile(const TensorSlot* tensors, const ChunkSlot* chunks, int64_t tile) {
  const ChunkSlot chunk = chunks[tile / kBulkTilesPerChunk];
  const int64_t start = chunk.start + (tile % kBulkTilesPerChunk) * kBulkTileElements;
  const int64_t numel = tensors[chunk.tensor].numel;
  if (start >= numel) return {};
  return {chunk.tensor, start, static_cast<int>(min(static_cast<int64_t>(kBulkTileElements), numel - start))};
}

// Bytes an element of each of the kBulkArrays arrays takes (0: the slot has no such array).
__device__ __forceinline__ void bulk_element_bytes(const TensorSlot& slot, int bytes[kBulkArrays]) {
  bytes[0] = slot.parameter_kind == kStorageF32 ? 4 : 2;
  bytes[1] = slot.master_kind == kMasterF32 ? 4 : slot.master_kind == kMasterLowHalves ? 2 : 0;
  bytes[2] = slot.grad_kind == kStorageF32 ? 4 : 2;
  bytes[3] = 4;
  bytes[4] = 4;
}

__global__ void __launch_bounds__(kBulkThreads, 1)
    adamw_bulk_kernel(const TensorSlot* tensors, const ChunkSlot* chunks, int64_t tiles, AdamWConstants constants,
                      const float* guard, const float* gradient_scale, const float* previous_guard) {
  extern __shared__ __align__(128) unsigned char stage_storage[];  // [kBulkStages][kBulkArrays][region]
  __shared__ uint64_t loaded[kBulkStages];
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kBulkStages; ++stage) bulk::barrier_init(&loaded[stage], 1);
    bulk::fence_barrier_init();
  }
  __syncthreads();
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  if (!guard_allows(guard)) return;
  const float scale = gradient_scale != nullptr ? *gradient_scale : 1.0f;
  const int64_t stride = gridDim.x;

  // Thread 0 has the first multiple of 8 elements of `tile` copied into `stage`.
  const auto load = [&](int stage, const BulkTile& tile) {
    const TensorSlot& slot = tensors[tile.tensor];
    int bytes[kBulkArrays];
    bulk_element_bytes(slot, bytes);
    const void* sources[kBulkArrays] = {slot.parameter, slot.master, slot.grad, slot.exp_avg, slot.exp_avg_sq};
    const int copied = tile.count / 8 * 8;
    uint32_t total = 0;
    for (int a = 0; a < kBulkArrays; ++a) total += static_cast<uint32_t>(copied * bytes[a]);
    bulk::arrive_expecting(&loaded[stage], total);  // 0 bytes (a tile under 8 elements): the arrival alone
    for (int a = 0; a < kBulkArrays; ++a) {
      if (copied == 0 || bytes[a] == 0) continue;
      bulk::copy_to_shared(stage_storage + stage * kBulkStageBytes + a * kBulkRegionBytes,
                           static_cast<const unsigned char*>(sources[a]) + tile.start * bytes[a],
                           static_cast<uint32_t>(copied * bytes[a]), &loaded[stage]);
    }
  };
  // Thread 0's cursor: the next tile of the sequence to be loaded, past the empty ones.
  int64_t next_load = blockIdx.x;
  const auto load_next = [&](int stage) {
    for (; next_load < tiles; next_load += stride) {
      const BulkTile tile = bulk_tile(tensors, chunks, next_load);
      if (tile.count == 0) continue;
      load(stage, tile);
      next_load += stride;
      return;
    }
  };
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kBulkStages; ++stage) load_next(stage);
  }

  int used = 0;  // tiles computed so far: the stage is used % kBulkStages, its phase used / kBulkStages
  for (int64_t index = blockIdx.x; index < tiles; index += stride) {
    const BulkTile tile = bulk_tile(tensors, chunks, index);
    if (tile.count == 0) continue;
    const int stage = used % kBulkStages;
    const auto parity = static_cast<uint32_t>((used / kBulkStages) % 2);
    ++used;
    const TensorSlot slot = slot_for_step(tensors[tile.tensor], previous_guard);
    bulk::wait(&loaded[stage], parity);
    const unsigned char* base = stage_storage + stage * kBulkStageBytes;
    const int first = 4 * static_cast<int>(threadIdx.x);
    if (first < tile.count / 8 * 8) {
      const AdamWSources from{base,
                              base + kBulkRegionBytes,
                              base + 2 * kBulkRegionBytes,
                              reinterpret_cast<const float*>(base + 3 * kBulkRegionBytes),
                              reinterpret_cast<const float*>(base + 4 * kBulkRegionBytes),
                              first};
      adamw_vector<4>(slot, from, tile.start + first, constants, scale);
    } else {
      for (int e = first; e < min(first + 4, tile.count); ++e) adamw_one(slot, tile.start + e, constants, scale);
    }
    __syncthreads();  // every thread is done reading this stage
    if (threadIdx.x == 0) {
      bulk::fence_before_copy_over_read_memory();
      load_next(stage);
    }
  }
}

struct SgdSlot {
  void* parameter;
  const void* grad;
  float* momentum_buffer;  // null when momentum is 0
  void* master;            // as TensorSlot::master
  int64_t numel;
  float lr;
  float weight_decay;
  int32_t parameter_kind;
  int32_t grad_kind;
  int32_t master_kind;  // MasterKind
  int32_t unused;       // keeps the slot a multiple of 8 bytes
};

__global__ void sgd_chunks_kernel(const SgdSlot* tensors, const ChunkSlot* chunks, float momentum, bool nesterov,
                                  const float* guard) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  if (!guard_allows(guard)) return;
  const ChunkSlot chunk = chunks[blockIdx.x];
  const SgdSlot slot = tensors[chunk.tensor];
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  for (int64_t i = chunk.start + threadIdx.x; i < end; i += blockDim.x) {
    float kept = 0.0f;
    int16_t low = 0;
    load_master(slot.master, slot.master_kind, i, kept, low);
    float value = starting_value(load_kind(slot.parameter, slot.parameter_kind, i), kept, low, slot.master_kind);
    float direction = load_kind(slot.grad, slot.grad_kind, i);
    if (slot.weight_decay != 0.0f) direction = direction + slot.weight_decay * value;
    if (slot.momentum_buffer != nullptr) {
      const float buffer = momentum * slot.momentum_buffer[i] + direction;
      slot.momentum_buffer[i] = buffer;
      direction = nesterov ? direction + momentum * buffer : buffer;
    }
    value = value - slot.lr * direction;
    store_master(slot.master, slot.master_kind, i, value);
    store_kind(slot.parameter, slot.parameter_kind, i, parameter_value(value, slot.master_kind));
  }
}

// The checks every multi-tensor update makes of one parameter's tensors: same device as the first
// parameter, contiguous, the parameter's size; a master exactly for a 16-bit parameter, i16 low
// halves for bf16 and f32 for f16. Returns the master's MasterKind.
int32_t check_update_tensors(const char* op, const Device& device, const Tensor& parameter, const Tensor& master,
                             std::initializer_list<const Tensor*> same_size) {
  for (const Tensor* tensor : same_size) {
    WEFT_CHECK(tensor->device() == device && tensor->is_contiguous() && tensor->numel() == parameter.numel(), op,
               ": ", tensor->describe(), " does not fit parameter ", parameter.describe(),
               " (same device, size, contiguous)");
  }
  if (parameter.dtype() == kFloat32) {
    WEFT_CHECK(!master.defined(), op, ": ", parameter.describe(), " must not have a master");
    return kNoMaster;
  }
  const DType expected = parameter.dtype() == kBFloat16 ? kInt16 : kFloat32;
  WEFT_CHECK(master.defined() && master.dtype() == expected && master.device() == device && master.is_contiguous() &&
                 master.numel() == parameter.numel(),
             op, ": ", parameter.describe(), " needs a contiguous ", dtype_name(expected),
             " master of its size on its device, got ", master.defined() ? master.describe() : std::string("none"));
  return expected == kInt16 ? kMasterLowHalves : kMasterF32;
}

// The device pointer of a guard or gradient scale (`what`; null without one), after checking it is
// one f32 on `device`.
const float* scalar_pointer(const Tensor& scalar, const Device& device, const char* op, const char* what) {
  if (!scalar.defined()) return nullptr;
  WEFT_CHECK(scalar.numel() == 1 && scalar.dtype() == kFloat32 && scalar.device() == device, op, ": the ", what,
             " must be one f32 element on ", device.to_string(), ", got ", scalar.describe());
  return scalar.data<float>();
}

// Whether adamw_bulk_kernel may run: WEFT_ADAMW_BULK=1, or set_adamw_bulk_for_testing. Off by
// default until it has run on a GPU: it was written in a session that got no GPU machine
// (docs/performance.md, 2026-12-07, thirty-fourth session), and the next one measures it against
// adamw_chunks_kernel.
std::atomic<bool>& adamw_bulk_setting() {
  static std::atomic<bool> allowed = [] {
    const char* value = std::getenv("WEFT_ADAMW_BULK");
    if (value == nullptr || std::string_view(value) == "0") return false;
    if (std::string_view(value) == "1") return true;
    std::fprintf(stderr, "weft: WEFT_ADAMW_BULK=%s is not one of 0, 1; using 0\n", value);
    return false;
  }();
  return allowed;
}

std::atomic<int64_t> adamw_bulk_launches{0};

// Updates every entry in one kernel launch on the current stream of their (common) device.
void adamw_multi_tensor(absl::Span<const AdamWTensorUpdate> updates, double beta1, double beta2, double eps,
                        const Tensor& guard, const Tensor& gradient_scale, const Tensor& previous_guard) {
  if (updates.empty()) return;
  const Device device = updates[0].parameter.device();
  const float* guard_data = scalar_pointer(guard, device, "adamw_multi_tensor", "guard");
  const float* previous_guard_data = scalar_pointer(previous_guard, device, "adamw_multi_tensor", "previous guard");
  const float* scale_data = scalar_pointer(gradient_scale, device, "adamw_multi_tensor", "gradient scale");
  WEFT_CHECK(device.is_cuda(), "adamw_multi_tensor: parameters must be on a CUDA device, got ",
             updates[0].parameter.describe());
  std::vector<TensorSlot> tensors;
  std::vector<ChunkSlot> chunks;
  for (const AdamWTensorUpdate& update : updates) {
    const int32_t master_kind =
        check_update_tensors("adamw_multi_tensor", device, update.parameter, update.master,
                             {&update.parameter, &update.grad, &update.exp_avg, &update.exp_avg_sq});
    WEFT_CHECK(update.exp_avg.dtype() == kFloat32 && update.exp_avg_sq.dtype() == kFloat32,
               "adamw_multi_tensor: state must be f32 on CUDA");
    TensorSlot slot{};
    slot.parameter = update.parameter.raw_data();
    slot.grad = update.grad.raw_data();
    slot.exp_avg = update.exp_avg.data<float>();
    slot.exp_avg_sq = update.exp_avg_sq.data<float>();
    slot.master = master_kind == kNoMaster ? nullptr : update.master.raw_data();
    slot.master_kind = master_kind;
    slot.numel = update.parameter.numel();
    slot.step_size = static_cast<float>(update.step_size);
    slot.bias_correction2_sqrt = static_cast<float>(update.bias_correction2_sqrt);
    slot.decay = static_cast<float>(update.decay);
    slot.step_size_if_previous_skipped = static_cast<float>(update.step_size_if_previous_skipped);
    slot.bias_correction2_sqrt_if_previous_skipped =
        static_cast<float>(update.bias_correction2_sqrt_if_previous_skipped);
    slot.parameter_kind = storage_kind(update.parameter, "adamw_multi_tensor: parameter");
    slot.grad_kind = storage_kind(update.grad, "adamw_multi_tensor: grad");
    const auto all_arrays = [&](bool (*aligned)(const Tensor&)) {
      return aligned(update.parameter) && aligned(update.grad) && aligned(update.exp_avg) &&
             aligned(update.exp_avg_sq) && (master_kind == kNoMaster || aligned(update.master));
    };
    // Sixteen elements a thread (two 16-byte words of each 16-bit array) keep enough bytes in flight:
    // on the H200, 48 bf16 [2048, 2048] parameters took 2.21 ms four at a time, 1.70 ms eight at a
    // time and 1.53 ms sixteen (56%, 72% and 80% of copy bandwidth; docs/performance.md).
    slot.vector_width = all_arrays(eight_aligned) ? 16 : all_arrays(four_aligned) ? 4 : 1;
    add_chunks(chunks, static_cast<int64_t>(tensors.size()), slot.numel);
    tensors.push_back(slot);
  }
  if (chunks.empty()) return;
  const DeviceTable<TensorSlot> table = upload_table(tensors, chunks, device);
  set_device(device.index);
  const AdamWConstants constants{static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
                                 static_cast<float>(beta2), static_cast<float>(1.0 - beta2), static_cast<float>(eps)};
  const auto eight_aligned_slot = [](const TensorSlot& slot) { return slot.vector_width == 16; };
  if (adamw_bulk_setting().load() && std::all_of(tensors.begin(), tensors.end(), eight_aligned_slot) &&
      bulk::kernel_runs_bulk_copies<adamw_bulk_kernel>(device.index)) {
    allow_dynamic_shared_memory<adamw_bulk_kernel>(kBulkSharedBytes, device.index);
    const auto tiles = static_cast<int64_t>(chunks.size()) * kBulkTilesPerChunk;
    const auto grid = static_cast<unsigned int>(
        std::min<int64_t>(static_cast<int64_t>(chunks.size()), multiprocessor_count(device.index)));
    launch_dependent(adamw_bulk_kernel, grid, kBulkThreads, kBulkSharedBytes, current_stream(device.index),
                     table.slots, table.chunks, tiles, constants, guard_data, scale_data, previous_guard_data);
    adamw_bulk_launches.fetch_add(1);
  } else {
    launch_dependent(adamw_chunks_kernel, static_cast<unsigned int>(chunks.size()), kThreads, 0,
                     current_stream(device.index), table.slots, table.chunks, constants, guard_data, scale_data,
                     previous_guard_data);
  }
  WEFT_CUDA_CHECK_LAUNCH();
}

// Updates every entry in one kernel launch on the current stream of their (common) device.
void sgd_multi_tensor(absl::Span<const SgdTensorUpdate> updates, double momentum, bool nesterov,
                      const Tensor& guard) {
  if (updates.empty()) return;
  const Device device = updates[0].parameter.device();
  const float* guard_data = scalar_pointer(guard, device, "sgd_multi_tensor", "guard");
  WEFT_CHECK(device.is_cuda(), "sgd_multi_tensor: parameters must be on a CUDA device, got ",
             updates[0].parameter.describe());
  std::vector<SgdSlot> tensors;
  std::vector<ChunkSlot> chunks;
  for (const SgdTensorUpdate& update : updates) {
    const int32_t master_kind = check_update_tensors("sgd_multi_tensor", device, update.parameter, update.master,
                                                     {&update.parameter, &update.grad});
    const bool with_buffer = update.momentum_buffer.defined();
    WEFT_CHECK(with_buffer == (momentum != 0.0), "sgd_multi_tensor: a momentum buffer goes with momentum != 0 (",
               momentum, "), got ", with_buffer ? update.momentum_buffer.describe() : std::string("none"));
    if (with_buffer) {
      check_update_tensors("sgd_multi_tensor", device, update.parameter, update.master, {&update.momentum_buffer});
      WEFT_CHECK(update.momentum_buffer.dtype() == kFloat32, "sgd_multi_tensor: the momentum buffer must be f32 on CUDA");
    }
    SgdSlot slot{};
    slot.parameter = update.parameter.raw_data();
    slot.grad = update.grad.raw_data();
    slot.momentum_buffer = with_buffer ? update.momentum_buffer.data<float>() : nullptr;
    slot.master = master_kind == kNoMaster ? nullptr : update.master.raw_data();
    slot.master_kind = master_kind;
    slot.numel = update.parameter.numel();
    slot.lr = static_cast<float>(update.lr);
    slot.weight_decay = static_cast<float>(update.weight_decay);
    slot.parameter_kind = storage_kind(update.parameter, "sgd_multi_tensor: parameter");
    slot.grad_kind = storage_kind(update.grad, "sgd_multi_tensor: grad");
    add_chunks(chunks, static_cast<int64_t>(tensors.size()), slot.numel);
    tensors.push_back(slot);
  }
  if (chunks.empty()) return;
  const DeviceTable<SgdSlot> table = upload_table(tensors, chunks, device);
  set_device(device.index);
  launch_dependent(sgd_chunks_kernel, static_cast<unsigned int>(chunks.size()), kThreads, 0,
                   current_stream(device.index), table.slots, table.chunks, static_cast<float>(momentum), nesterov,
                   guard_data);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool set_adamw_bulk_for_testing(bool allowed) { return adamw_bulk_setting().exchange(allowed); }

int64_t adamw_bulk_launches_for_testing() { return adamw_bulk_launches.load(); }

}  // namespace cuda

void CudaBackend::adamw_update(absl::Span<const AdamWTensorUpdate> updates,
                               const AdamWHyperparameters& hyperparameters) {
  cuda::adamw_multi_tensor(updates, hyperparameters.beta1, hyperparameters.beta2, hyperparameters.eps,
                           hyperparameters.guard, hyperparameters.gradient_scale, hyperparameters.previous_guard);
}

void CudaBackend::sgd_update(absl::Span<const SgdTensorUpdate> updates, const SgdHyperparameters& hyperparameters) {
  cuda::sgd_multi_tensor(updates, hyperparameters.momentum, hyperparameters.nesterov, hyperparameters.guard);
}

namespace cuda {
namespace {

// Split masters converted on the device (Backend::join_master_halves, master_low_halves): one
// element a thread, grid-stride, for checkpoints (not in a step).
__global__ void join_master_halves_kernel(const uint16_t* high, const int16_t* low, float* values, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    values[i] = __uint_as_float(master_bits(high[i], low[i]));
  }
}

__global__ void master_low_halves_kernel(const float* values, int16_t* low, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    low[i] = master_low_half(__float_as_uint(values[i]));
  }
}

unsigned int grid_stride_blocks(int64_t count) {
  constexpr int64_t kMaximumBlocks = 8192;  // enough to fill the GPU; the loop covers the rest
  return static_cast<unsigned int>(std::min<int64_t>(kMaximumBlocks, (count + kThreads - 1) / kThreads));
}

}  // namespace
}  // namespace cuda

void CudaBackend::join_master_halves(const Tensor& high, const Tensor& low, const Tensor& values) {
  check_master_halves("join_master_halves", values.device(), values, low, high);
  WEFT_CHECK(values.device().is_cuda(), "join_master_halves: ", values.describe(), " is not on a CUDA device");
  const int64_t count = values.numel();
  if (count == 0) return;
  cuda::set_device(values.device().index);
  cuda::join_master_halves_kernel<<<cuda::grid_stride_blocks(count), cuda::kThreads, 0,
                                    cuda::current_stream(values.device().index)>>>(
      static_cast<const uint16_t*>(high.raw_data()), low.data<int16_t>(), values.data<float>(), count);
  WEFT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::master_low_halves(const Tensor& values, const Tensor& low) {
  check_master_halves("master_low_halves", values.device(), values, low);
  WEFT_CHECK(values.device().is_cuda(), "master_low_halves: ", values.describe(), " is not on a CUDA device");
  const int64_t count = values.numel();
  if (count == 0) return;
  cuda::set_device(values.device().index);
  cuda::master_low_halves_kernel<<<cuda::grid_stride_blocks(count), cuda::kThreads, 0,
                                   cuda::current_stream(values.device().index)>>>(values.data<float>(),
                                                                                  low.data<int16_t>(), count);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace weft
