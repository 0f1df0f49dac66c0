// Tables for multi-tensor kernels: one launch walks a whole list of tensors (every parameter of a
// model, whatever their sizes) in chunks of kChunkElements. The host packs one slot per tensor (a
// struct the kernel defines) and one ChunkSlot per chunk into one device table, copied in one
// transfer; block b handles chunks[b]. A tensor's chunks are consecutive in the table.
//
// Elements are f32, bf16 or f16, tagged per tensor (StorageKind) and read and written as f32
// through load_kind / store_kind, so one kernel serves every mix of dtypes; load4_kind / store4_kind
// move four elements per access for tensors that four_aligned() accepts (vector loads keep many
// bytes in flight per thread, which a memory-bound pass needs to approach the memory's bandwidth).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace weft::cuda {

inline constexpr int64_t kChunkElements = 65536;

enum StorageKind : int32_t { kStorageF32 = 0, kStorageBF16 = 1, kStorageF16 = 2 };

struct ChunkSlot {
  int64_t tensor;  // index into the tensor slots
  int64_t start;   // first element of the chunk
};

// The storage tag of `tensor`; `what` names the op and the tensor's role for the error.
inline int32_t storage_kind(const Tensor& tensor, const char* what) {
  switch (tensor.dtype()) {
    case kFloat32: return kStorageF32;
    case kBFloat16: return kStorageBF16;
    case kFloat16: return kStorageF16;
    default: WEFT_FAIL(what, " ", tensor.describe(), " must be f32, bf16 or f16");
  }
}

// Appends the chunks of tensor slot `tensor` (numel elements).
inline void add_chunks(std::vector<ChunkSlot>& chunks, int64_t tensor, int64_t numel) {
  for (int64_t start = 0; start < numel; start += kChunkElements) chunks.push_back({tensor, start});
}

template <class Slot>
struct DeviceTable {
  Tensor storage;  // owns the device copy; keep it alive until the kernels reading it are enqueued
  const Slot* slots = nullptr;
  const ChunkSlot* chunks = nullptr;
};

// Copies [slots][chunks] to `device` in one transfer (8-byte aligned). The source is pageable host
// memory, so the copy has read it before this returns.
template <class Slot>
DeviceTable<Slot> upload_table(const std::vector<Slot>& slots, const std::vector<ChunkSlot>& chunks,
                               const Device& device) {
  static_assert(sizeof(Slot) % 8 == 0, "slots keep the chunk table 8-byte aligned");
  const size_t slot_bytes = slots.size() * sizeof(Slot);
  const size_t chunk_bytes = chunks.size() * sizeof(ChunkSlot);
  const int64_t words = static_cast<int64_t>((slot_bytes + chunk_bytes + 7) / 8);
  Tensor host = Tensor::empty({words}, kInt64, Device::cpu());
  std::memcpy(host.raw_data(), slots.data(), slot_bytes);
  std::memcpy(static_cast<char*>(host.raw_data()) + slot_bytes, chunks.data(), chunk_bytes);
  DeviceTable<Slot> table;
  table.storage = host.to(device);
  table.slots = static_cast<const Slot*>(table.storage.raw_data());
  table.chunks = reinterpret_cast<const ChunkSlot*>(static_cast<const char*>(table.storage.raw_data()) + slot_bytes);
  return table;
}

__device__ __forceinline__ float load_kind(const void* base, int32_t kind, int64_t i) {
  switch (kind) {
    case kStorageBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case kStorageF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_kind(void* base, int32_t kind, int64_t i, float value) {
  switch (kind) {
    case kStorageBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(value); return;
    case kStorageF16: static_cast<__half*>(base)[i] = __float2half_rn(value); return;
    default: static_cast<float*>(base)[i] = value;
  }
}

// --- Four elements at a time ------------------------------------------------------------------
// A tensor whose base address is aligned to four of its elements is read and written in 16-byte
// (f32) or 8-byte (bf16, f16) words at indices that are multiples of four: chunks start at
// multiples of kChunkElements, so a thread stepping by 4 stays aligned. Rounding is per element
// (round to nearest even), as store_kind does, so results are bitwise those of the scalar path.

inline bool four_aligned(const Tensor& tensor) {
  return reinterpret_cast<uintptr_t>(tensor.raw_data()) % (4 * static_cast<uintptr_t>(tensor.element_size())) == 0;
}

__device__ __forceinline__ void load4_kind(const void* base, int32_t kind, int64_t i, float out[4]) {
  switch (kind) {
    case kStorageBF16: {
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
      const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      out[0] = low.x, out[1] = low.y, out[2] = high.x, out[3] = high.y;
      return;
    }
    case kStorageF16: {
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(base) + i);
      const float2 low = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      const float2 high = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
      out[0] = low.x, out[1] = low.y, out[2] = high.x, out[3] = high.y;
      return;
    }
    default: {
      const float4 raw = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
      out[0] = raw.x, out[1] = raw.y, out[2] = raw.z, out[3] = raw.w;
    }
  }
}

__device__ __forceinline__ void store4_kind(void* base, int32_t kind, int64_t i, const float value[4]) {
  switch (kind) {
    case kStorageBF16: {
      uint2 raw;
      *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(value[0], value[1]);
      *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(value[2], value[3]);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + i) = raw;
      return;
    }
    case kStorageF16: {
      uint2 raw;
      *reinterpret_cast<__half2*>(&raw.x) = __floats2half2_rn(value[0], value[1]);
      *reinterpret_cast<__half2*>(&raw.y) = __floats2half2_rn(value[2], value[3]);
      *reinterpret_cast<uint2*>(static_cast<__half*>(base) + i) = raw;
      return;
    }
    default:
      *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = make_float4(value[0], value[1], value[2], value[3]);
  }
}


// --- Eight elements at a time -----------------------------------------------------------------
// As above with 16-byte words for bf16 and f16 (two 16-byte words for f32): a tensor whose base
// address is aligned to eight of its elements, at indices that are multiples of eight. Passes
// that move several 16-bit arrays (AdamW: the parameter, its gradient and its master's low halves)
// keep twice the bytes in flight per access this way. Rounding is per element, as store_kind's.
inline bool eight_aligned(const Tensor& tensor) {
  return reinterpret_cast<uintptr_t>(tensor.raw_data()) % (8 * static_cast<uintptr_t>(tensor.element_size())) == 0;
}

__device__ __forceinline__ void load8_kind(const void* base, int32_t kind, int64_t i, float out[8]) {
  if (kind == kStorageF32) {
    load4_kind(base, kind, i, out);
    load4_kind(base, kind, i + 4, out + 4);
    return;
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float2 pair = kind == kStorageBF16 ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]))
                                             : __half22float2(*reinterpret_cast<const __half2*>(&words[w]));
    out[2 * w] = pair.x;
    out[2 * w + 1] = pair.y;
  }
}

__device__ __forceinline__ void store8_kind(void* base, int32_t kind, int64_t i, const float value[8]) {
  if (kind == kStorageF32) {
    store4_kind(base, kind, i, value);
    store4_kind(base, kind, i + 4, value + 4);
    return;
  }
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if (kind == kStorageBF16) {
      *reinterpret_cast<__nv_bfloat162*>(&words[w]) = __floats2bfloat162_rn(value[2 * w], value[2 * w + 1]);
    } else {
      *reinterpret_cast<__half2*>(&words[w]) = __floats2half2_rn(value[2 * w], value[2 * w + 1]);
    }
  }
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + i) = make_uint4(words[0], words[1], words[2], words[3]);
}

}  // namespace weft::cuda
