// Multi-tensor AdamW and SGD behind CudaBackend::adamw_update and sgd_update.
// runtime/optimizer_update.h states the math and the master-weight rule; these kernels follow them
// exactly as the CPU loops of runtime/cpu/optimizer_update.cc do, in f32, with each per-parameter
// scalar rounded once to f32 on the host. One slot per parameter in a multi_tensor_table.cuh
// table; each block updates one chunk of 64K elements, so one launch covers a whole model whatever
// the parameter sizes. AdamW moves four elements per access where a parameter's arrays allow
// (multi_tensor_table.cuh: four_aligned), with per-element arithmetic unchanged. Parameters are
// f32, bf16 or f16; gradients f32, bf16 or f16 (read as they are, not converted); state is f32.
#include "runtime/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/multi_tensor_table.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"

namespace weft {
namespace cuda {
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
  int32_t four_aligned;  // every array of the slot four_aligned(): the kernel moves 4 elements per access
  int32_t unused;        // keeps the slot a multiple of 8 bytes
};

// The value an update starts from: the f32 master of a 16-bit parameter, unless an outside write
// to the parameter (a weight load) left the master stale, in which case the stored parameter wins
// (as load_parameter_value does in runtime/cpu/optimizer_update.cc). `stored` is the parameter's
// value, `kept` the master's (ignored without a master).
__device__ __forceinline__ float starting_value(float stored, float kept, int32_t parameter_kind, bool has_master) {
  if (!has_master) return stored;
  const float rounded = parameter_kind == kStorageBF16 ? __bfloat162float(__float2bfloat16_rn(kept))
                                                       : __half2float(__float2half_rn(kept));
  return (rounded == stored || (isnan(rounded) && isnan(stored))) ? kept : stored;
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

// Element i alone (tails, and tensors that are not four_aligned).
__device__ __forceinline__ void adamw_one(const TensorSlot& slot, int64_t i, const AdamWConstants& c, float scale) {
  const bool has_master = slot.master != nullptr;
  const float stored = load_kind(slot.parameter, slot.parameter_kind, i);
  float value = starting_value(stored, has_master ? slot.master[i] : 0.0f, slot.parameter_kind, has_master);
  float m = slot.exp_avg[i], v = slot.exp_avg_sq[i];
  value = adamw_step(value, load_kind(slot.grad, slot.grad_kind, i) * scale, m, v, slot, c);
  slot.exp_avg[i] = m;
  slot.exp_avg_sq[i] = v;
  if (has_master) slot.master[i] = value;
  store_kind(slot.parameter, slot.parameter_kind, i, value);
}

// gradient_scale: null, or the factor every gradient is multiplied by as it is read.
__global__ void adamw_chunks_kernel(const TensorSlot* tensors, const ChunkSlot* chunks, AdamWConstants constants,
                                    const float* guard, const float* gradient_scale) {
  if (!guard_allows(guard)) return;
  const float scale = gradient_scale != nullptr ? *gradient_scale : 1.0f;
  const ChunkSlot chunk = chunks[blockIdx.x];
  const TensorSlot slot = tensors[chunk.tensor];
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  int64_t scalar_start = chunk.start;
  if (slot.four_aligned) {
    // Four elements per thread and access: the same arithmetic per element as adamw_one.
    const bool has_master = slot.master != nullptr;
    const int64_t vector_end = chunk.start + (end - chunk.start) / 4 * 4;
    for (int64_t i = chunk.start + 4 * static_cast<int64_t>(threadIdx.x); i < vector_end; i += 4 * blockDim.x) {
      float stored[4], kept[4] = {0.f, 0.f, 0.f, 0.f}, g[4], m[4], v[4], value[4];
      load4_kind(slot.parameter, slot.parameter_kind, i, stored);
      if (has_master) load4_kind(slot.master, kStorageF32, i, kept);
      load4_kind(slot.grad, slot.grad_kind, i, g);
#pragma unroll
      for (int j = 0; j < 4; ++j) g[j] *= scale;
      load4_kind(slot.exp_avg, kStorageF32, i, m);
      load4_kind(slot.exp_avg_sq, kStorageF32, i, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        value[j] = adamw_step(starting_value(stored[j], kept[j], slot.parameter_kind, has_master), g[j], m[j], v[j],
                              slot, constants);
      }
      store4_kind(slot.exp_avg, kStorageF32, i, m);
      store4_kind(slot.exp_avg_sq, kStorageF32, i, v);
      if (has_master) store4_kind(slot.master, kStorageF32, i, value);
      store4_kind(slot.parameter, slot.parameter_kind, i, value);
    }
    scalar_start = vector_end;
  }
  for (int64_t i = scalar_start + threadIdx.x; i < end; i += blockDim.x) adamw_one(slot, i, constants, scale);
}

struct SgdSlot {
  void* parameter;
  const void* grad;
  float* momentum_buffer;  // null when momentum is 0
  float* master;           // null for f32 parameters
  int64_t numel;
  float lr;
  float weight_decay;
  int32_t parameter_kind;
  int32_t grad_kind;
};

__global__ void sgd_chunks_kernel(const SgdSlot* tensors, const ChunkSlot* chunks, float momentum, bool nesterov,
                                  const float* guard) {
  if (!guard_allows(guard)) return;
  const ChunkSlot chunk = chunks[blockIdx.x];
  const SgdSlot slot = tensors[chunk.tensor];
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  for (int64_t i = chunk.start + threadIdx.x; i < end; i += blockDim.x) {
    const bool has_master = slot.master != nullptr;
    float value = starting_value(load_kind(slot.parameter, slot.parameter_kind, i), has_master ? slot.master[i] : 0.0f,
                                 slot.parameter_kind, has_master);
    float direction = load_kind(slot.grad, slot.grad_kind, i);
    if (slot.weight_decay != 0.0f) direction = direction + slot.weight_decay * value;
    if (slot.momentum_buffer != nullptr) {
      const float buffer = momentum * slot.momentum_buffer[i] + direction;
      slot.momentum_buffer[i] = buffer;
      direction = nesterov ? direction + momentum * buffer : buffer;
    }
    value = value - slot.lr * direction;
    if (has_master) slot.master[i] = value;
    store_kind(slot.parameter, slot.parameter_kind, i, value);
  }
}

// The checks every multi-tensor update makes of one parameter's tensors: same device as the first
// parameter, contiguous, the parameter's size; an f32 master exactly for a 16-bit parameter.
void check_update_tensors(const char* op, const Device& device, const Tensor& parameter, const Tensor& master,
                          std::initializer_list<const Tensor*> same_size) {
  for (const Tensor* tensor : same_size) {
    WEFT_CHECK(tensor->device() == device && tensor->is_contiguous() && tensor->numel() == parameter.numel(), op,
               ": ", tensor->describe(), " does not fit parameter ", parameter.describe(),
               " (same device, size, contiguous)");
  }
  const bool sixteen_bit = parameter.dtype() != kFloat32;
  WEFT_CHECK(sixteen_bit == master.defined(), op, ": ", parameter.describe(),
             sixteen_bit ? " needs an f32 master copy" : " must not have a master copy");
}

// The device pointer of a guard or gradient scale (`what`; null without one), after checking it is
// one f32 on `device`.
const float* scalar_pointer(const Tensor& scalar, const Device& device, const char* op, const char* what) {
  if (!scalar.defined()) return nullptr;
  WEFT_CHECK(scalar.numel() == 1 && scalar.dtype() == kFloat32 && scalar.device() == device, op, ": the ", what,
             " must be one f32 element on ", device.to_string(), ", got ", scalar.describe());
  return scalar.data<float>();
}

// Updates every entry in one kernel launch on the current stream of their (common) device.
void adamw_multi_tensor(absl::Span<const AdamWTensorUpdate> updates, double beta1, double beta2, double eps,
                        const Tensor& guard, const Tensor& gradient_scale) {
  if (updates.empty()) return;
  const Device device = updates[0].parameter.device();
  const float* guard_data = scalar_pointer(guard, device, "adamw_multi_tensor", "guard");
  const float* scale_data = scalar_pointer(gradient_scale, device, "adamw_multi_tensor", "gradient scale");
  WEFT_CHECK(device.is_cuda(), "adamw_multi_tensor: parameters must be on a CUDA device, got ",
             updates[0].parameter.describe());
  std::vector<TensorSlot> tensors;
  std::vector<ChunkSlot> chunks;
  for (const AdamWTensorUpdate& update : updates) {
    check_update_tensors("adamw_multi_tensor", device, update.parameter, update.master,
                         {&update.parameter, &update.grad, &update.exp_avg, &update.exp_avg_sq});
    WEFT_CHECK(update.exp_avg.dtype() == kFloat32 && update.exp_avg_sq.dtype() == kFloat32,
               "adamw_multi_tensor: state must be f32 on CUDA");
    const bool sixteen_bit = update.parameter.dtype() != kFloat32;
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
    slot.four_aligned = four_aligned(update.parameter) && four_aligned(update.grad) && four_aligned(update.exp_avg) &&
                        four_aligned(update.exp_avg_sq) && (!sixteen_bit || four_aligned(update.master));
    add_chunks(chunks, static_cast<int64_t>(tensors.size()), slot.numel);
    tensors.push_back(slot);
  }
  if (chunks.empty()) return;
  const DeviceTable<TensorSlot> table = upload_table(tensors, chunks, device);
  set_device(device.index);
  adamw_chunks_kernel<<<static_cast<unsigned int>(chunks.size()), kThreads, 0, current_stream(device.index)>>>(
      table.slots, table.chunks,
      AdamWConstants{static_cast<float>(beta1), static_cast<float>(1.0 - beta1), static_cast<float>(beta2),
                     static_cast<float>(1.0 - beta2), static_cast<float>(eps)},
      guard_data, scale_data);
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
    check_update_tensors("sgd_multi_tensor", device, update.parameter, update.master,
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
    slot.master = update.master.defined() ? update.master.data<float>() : nullptr;
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
  sgd_chunks_kernel<<<static_cast<unsigned int>(chunks.size()), kThreads, 0, current_stream(device.index)>>>(
      table.slots, table.chunks, static_cast<float>(momentum), nesterov, guard_data);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace cuda

void CudaBackend::adamw_update(absl::Span<const AdamWTensorUpdate> updates,
                               const AdamWHyperparameters& hyperparameters) {
  cuda::adamw_multi_tensor(updates, hyperparameters.beta1, hyperparameters.beta2, hyperparameters.eps,
                           hyperparameters.guard, hyperparameters.gradient_scale);
}

void CudaBackend::sgd_update(absl::Span<const SgdTensorUpdate> updates, const SgdHyperparameters& hyperparameters) {
  cuda::sgd_multi_tensor(updates, hyperparameters.momentum, hyperparameters.nesterov, hyperparameters.guard);
}

}  // namespace weft
