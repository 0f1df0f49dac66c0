// Multi-tensor AdamW (optimizer_kernels.h). The host packs one slot per parameter and one entry per
// chunk of 64K elements into a small device table; each block updates one chunk, so one launch
// covers a whole model whatever the parameter sizes.
#include "runtime/cuda/optimizer_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"

namespace weft::cuda {
namespace {

constexpr int64_t kChunkElements = 65536;
constexpr int kThreads = 512;

enum StorageKind : int32_t { kStorageF32 = 0, kStorageBF16 = 1, kStorageF16 = 2 };

struct TensorSlot {
  void* parameter;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* master;  // null for f32 parameters
  int64_t numel;
  float step_size;
  float bias_correction2_sqrt;
  float decay;
  int32_t parameter_kind;
  int32_t grad_kind;
};

struct ChunkSlot {
  int64_t tensor;
  int64_t start;
};

int32_t storage_kind(const Tensor& tensor, const char* role) {
  switch (tensor.dtype()) {
    case kFloat32: return kStorageF32;
    case kBFloat16: return kStorageBF16;
    case kFloat16: return kStorageF16;
    default: WEFT_FAIL("adamw_multi_tensor: ", role, " ", tensor.describe(), " must be f32, bf16 or f16");
  }
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

__global__ void adamw_chunks_kernel(const TensorSlot* tensors, const ChunkSlot* chunks, float beta1,
                                    float one_minus_beta1, float beta2, float one_minus_beta2, float eps) {
  const ChunkSlot chunk = chunks[blockIdx.x];
  const TensorSlot slot = tensors[chunk.tensor];
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  for (int64_t i = chunk.start + threadIdx.x; i < end; i += blockDim.x) {
    float value;
    if (slot.master != nullptr) {
      // An outside write to the 16-bit parameter (a weight load) wins over a stale master.
      const float stored = load_kind(slot.parameter, slot.parameter_kind, i);
      const float master = slot.master[i];
      float rounded;
      if (slot.parameter_kind == kStorageBF16) {
        rounded = __bfloat162float(__float2bfloat16_rn(master));
      } else {
        rounded = __half2float(__float2half_rn(master));
      }
      value = (rounded == stored || (isnan(rounded) && isnan(stored))) ? master : stored;
    } else {
      value = static_cast<float*>(slot.parameter)[i];
    }
    const float g = load_kind(slot.grad, slot.grad_kind, i);
    value = value * slot.decay;
    const float m = slot.exp_avg[i] * beta1 + g * one_minus_beta1;
    const float v = slot.exp_avg_sq[i] * beta2 + g * g * one_minus_beta2;
    slot.exp_avg[i] = m;
    slot.exp_avg_sq[i] = v;
    const float denominator = sqrtf(v) / slot.bias_correction2_sqrt + eps;
    value = value - slot.step_size * (m / denominator);
    if (slot.master != nullptr) slot.master[i] = value;
    store_kind(slot.parameter, slot.parameter_kind, i, value);
  }
}

}  // namespace

void adamw_multi_tensor(const std::vector<AdamWTensorUpdate>& updates, double beta1, double beta2, double eps) {
  if (updates.empty()) return;
  const Device device = updates[0].parameter.device();
  WEFT_CHECK(device.is_cuda(), "adamw_multi_tensor: parameters must be on a CUDA device, got ",
             updates[0].parameter.describe());
  std::vector<TensorSlot> tensors;
  std::vector<ChunkSlot> chunks;
  for (const AdamWTensorUpdate& update : updates) {
    for (const Tensor* tensor : {&update.parameter, &update.grad, &update.exp_avg, &update.exp_avg_sq}) {
      WEFT_CHECK(tensor->device() == device && tensor->is_contiguous() && tensor->numel() == update.parameter.numel(),
                 "adamw_multi_tensor: ", tensor->describe(), " does not fit parameter ", update.parameter.describe(),
                 " (same device, size, contiguous)");
    }
    WEFT_CHECK(update.exp_avg.dtype() == kFloat32 && update.exp_avg_sq.dtype() == kFloat32,
               "adamw_multi_tensor: state must be f32 on CUDA");
    const bool sixteen_bit = update.parameter.dtype() != kFloat32;
    WEFT_CHECK(sixteen_bit == update.master.defined(), "adamw_multi_tensor: ", update.parameter.describe(),
               sixteen_bit ? " needs an f32 master copy" : " must not have a master copy");
    TensorSlot slot{};
    slot.parameter = update.parameter.raw_data();
    slot.grad = update.grad.raw_data();
    slot.exp_avg = update.exp_avg.data<float>();
    slot.exp_avg_sq = update.exp_avg_sq.data<float>();
    slot.master = sixteen_bit ? update.master.data<float>() : nullptr;
    slot.numel = update.parameter.numel();
    slot.step_size = static_cast<float>(update.step_size);
    slot.bias_correction2_sqrt = static_cast<float>(update.bias_correction2_sqrt);
    slot.decay = static_cast<float>(update.decay);
    slot.parameter_kind = storage_kind(update.parameter, "parameter");
    slot.grad_kind = storage_kind(update.grad, "grad");
    for (int64_t start = 0; start < slot.numel; start += kChunkElements) {
      chunks.push_back({static_cast<int64_t>(tensors.size()), start});
    }
    tensors.push_back(slot);
  }
  if (chunks.empty()) return;
  // One host table, copied in one transfer: [tensor slots][chunk slots], 8-byte aligned.
  const size_t tensor_bytes = tensors.size() * sizeof(TensorSlot);
  const size_t chunk_bytes = chunks.size() * sizeof(ChunkSlot);
  const int64_t words = static_cast<int64_t>((tensor_bytes + chunk_bytes + 7) / 8);
  Tensor host = Tensor::empty({words}, kInt64, Device::cpu());
  std::memcpy(host.raw_data(), tensors.data(), tensor_bytes);
  std::memcpy(static_cast<char*>(host.raw_data()) + tensor_bytes, chunks.data(), chunk_bytes);
  Tensor table = host.to(device);  // pageable source: the copy has read it before returning
  const auto* device_tensors = static_cast<const TensorSlot*>(table.raw_data());
  const auto* device_chunks =
      reinterpret_cast<const ChunkSlot*>(static_cast<const char*>(table.raw_data()) + tensor_bytes);
  set_device(device.index);
  adamw_chunks_kernel<<<static_cast<unsigned int>(chunks.size()), kThreads, 0, current_stream(device.index)>>>(
      device_tensors, device_chunks, static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
      static_cast<float>(beta2), static_cast<float>(1.0 - beta2), static_cast<float>(eps));
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace weft::cuda
