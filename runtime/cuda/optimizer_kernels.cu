// Multi-tensor AdamW (optimizer_kernels.h): one slot per parameter in a multi_tensor_table.cuh
// table; each block updates one chunk of 64K elements, so one launch covers a whole model whatever
// the parameter sizes.
#include "runtime/cuda/optimizer_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/multi_tensor_table.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"

namespace weft::cuda {
namespace {

constexpr int kThreads = 512;

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
    slot.parameter_kind = storage_kind(update.parameter, "adamw_multi_tensor: parameter");
    slot.grad_kind = storage_kind(update.grad, "adamw_multi_tensor: grad");
    add_chunks(chunks, static_cast<int64_t>(tensors.size()), slot.numel);
    tensors.push_back(slot);
  }
  if (chunks.empty()) return;
  const DeviceTable<TensorSlot> table = upload_table(tensors, chunks, device);
  set_device(device.index);
  adamw_chunks_kernel<<<static_cast<unsigned int>(chunks.size()), kThreads, 0, current_stream(device.index)>>>(
      table.slots, table.chunks, static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
      static_cast<float>(beta2), static_cast<float>(1.0 - beta2), static_cast<float>(eps));
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace weft::cuda
