// Whole-model passes over a list of tensors (a model's gradients) in one or two launches, whatever
// their number and sizes, through multi_tensor_table.cuh tables of 64K-element chunks:
//   CudaBackend::squared_norms: each block adds the squares of one chunk into a partial sum, then
//     one warp per tensor adds its chunks' partials in order. f32 accumulation (fmaf), fixed order:
//     the same bits from run to run. Strided tensors are copied contiguous first. Tensors aligned to
//     four elements are read four at a time (scalar loads ran at 1.2 TB/s on the H200).
//   CudaBackend::scale_in_place: each block scales one chunk (strided tensors go through affine).
//   CudaBackend::clip_to_norm: one thread turns the squares into a factor in device memory (1 when
//     the norm is within the limit), then scale_in_place's kernel reads it; no host read.
// Elements are f32, bf16 or f16, read and written in place.
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/multi_tensor_table.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kChunkThreads = 512;
constexpr int kTensorsPerBlock = 8;  // one warp each in the second launch

struct NormSlot {
  const void* data;
  int64_t numel;
  int64_t first_chunk;  // this tensor's chunks are [first_chunk, first_chunk + chunk_count)
  int64_t chunk_count;
  int32_t kind;
  int32_t four_aligned;  // multi_tensor_table.cuh four_aligned(): four elements per access
};

__global__ void __launch_bounds__(kChunkThreads)
    chunk_squares_kernel(const NormSlot* tensors, const ChunkSlot* chunks, float* partials /* [chunks] */) {
  __shared__ float scratch[32];
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const ChunkSlot chunk = chunks[blockIdx.x];
  const NormSlot slot = tensors[chunk.tensor];
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  float total = 0.0f;
  int64_t scalar_start = chunk.start;
  if (slot.four_aligned) {
    // Vector loads, several in flight (no stores between them): the pass is bound by the
    // memory's bandwidth only with many bytes in flight per thread.
    const int64_t vector_end = chunk.start + (end - chunk.start) / 4 * 4;
#pragma unroll 4
    for (int64_t i = chunk.start + 4 * static_cast<int64_t>(threadIdx.x); i < vector_end; i += 4 * blockDim.x) {
      float values[4];
      load4_kind(slot.data, slot.kind, i, values);
#pragma unroll
      for (int j = 0; j < 4; ++j) total = fmaf(values[j], values[j], total);
    }
    scalar_start = vector_end;
  }
  for (int64_t i = scalar_start + threadIdx.x; i < end; i += blockDim.x) {
    const float value = load_kind(slot.data, slot.kind, i);
    total = fmaf(value, value, total);
  }
  total = block_sum(total, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(32 * kTensorsPerBlock)
    tensor_sums_kernel(const NormSlot* tensors, int64_t count, const float* partials, float* out /* [count] */) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int64_t tensor = static_cast<int64_t>(blockIdx.x) * kTensorsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (tensor >= count) return;  // whole warps leave together
  const NormSlot slot = tensors[tensor];
  float total = 0.0f;
  for (int64_t c = lane; c < slot.chunk_count; c += 32) total += partials[slot.first_chunk + c];
  total = warp_sum(total);
  if (lane == 0) out[tensor] = total;
}

struct ScaleSlot {
  void* data;
  int64_t numel;
  int32_t kind;
  int32_t four_aligned;  // four elements per access
};

// factor_on_device (clip_to_norm), when not null, replaces `factor`; 1 means "nothing to do".
__global__ void __launch_bounds__(kChunkThreads)
    scale_chunks_kernel(const ScaleSlot* tensors, const ChunkSlot* chunks, float factor,
                        const float* factor_on_device) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  if (factor_on_device != nullptr) {
    factor = *factor_on_device;
    if (factor == 1.0f) return;
  }
  const ChunkSlot chunk = chunks[blockIdx.x];
  const ScaleSlot slot = tensors[chunk.tensor];
  const int64_t end = min(chunk.start + kChunkElements, slot.numel);
  int64_t scalar_start = chunk.start;
  if (slot.four_aligned) {  // the same per-element rounding as the scalar loop
    const int64_t vector_end = chunk.start + (end - chunk.start) / 4 * 4;
    for (int64_t i = chunk.start + 4 * static_cast<int64_t>(threadIdx.x); i < vector_end; i += 4 * blockDim.x) {
      float values[4];
      load4_kind(slot.data, slot.kind, i, values);
#pragma unroll
      for (int j = 0; j < 4; ++j) values[j] *= factor;
      store4_kind(slot.data, slot.kind, i, values);
    }
    scalar_start = vector_end;
  }
  for (int64_t i = scalar_start + threadIdx.x; i < end; i += blockDim.x) {
    store_kind(slot.data, slot.kind, i, load_kind(slot.data, slot.kind, i) * factor);
  }
}

// clip_to_norm's decision, on one thread: the squares added in order in f64, as the host did.
__global__ void clip_factor_kernel(const float* squares, int64_t count, double max_norm, float* factor) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  double sum_of_squares = 0.0;
  for (int64_t i = 0; i < count; ++i) sum_of_squares += static_cast<double>(squares[i]);
  const double norm = sqrt(sum_of_squares);
  *factor = max_norm > 0.0 && isfinite(norm) && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

}  // namespace
}  // namespace cuda

void CudaBackend::squared_norms(absl::Span<const Tensor> tensors, const Tensor& out) {
  const int64_t count = static_cast<int64_t>(tensors.size());
  WEFT_CHECK(out.dim() == 1 && out.size(0) == count && out.is_contiguous() && out.dtype() == kFloat32 &&
                 out.device().is_cuda(),
             "squared_norms: out must be [", count, "] f32, contiguous, on a CUDA device; got ", out.describe());
  if (count == 0) return;
  const Device device = out.device();
  cuda::set_device(device.index);
  const cudaStream_t stream = cuda::current_stream(device.index);
  std::vector<Tensor> contiguous;  // keeps the copies of strided inputs alive until the launch
  std::vector<cuda::NormSlot> slots;
  std::vector<cuda::ChunkSlot> chunks;
  for (const Tensor& tensor : tensors) {
    WEFT_CHECK(tensor.device() == device, "squared_norms: ", tensor.describe(), " is not on ", device.to_string(),
               " like out");
    const Tensor& x = tensor.is_contiguous() ? tensor : contiguous.emplace_back(tensor.contiguous());
    cuda::NormSlot slot{};
    slot.data = x.raw_data();
    slot.numel = x.numel();
    slot.first_chunk = static_cast<int64_t>(chunks.size());
    slot.kind = cuda::storage_kind(x, "squared_norms:");
    slot.four_aligned = cuda::four_aligned(x);
    cuda::add_chunks(chunks, static_cast<int64_t>(slots.size()), slot.numel);
    slot.chunk_count = static_cast<int64_t>(chunks.size()) - slot.first_chunk;
    slots.push_back(slot);
  }
  const cuda::DeviceTable<cuda::NormSlot> table = cuda::upload_table(slots, chunks, device);
  // An empty tensor has no chunks: its warp adds nothing and writes 0.
  Tensor partials = Tensor::empty({std::max<int64_t>(1, static_cast<int64_t>(chunks.size()))}, kFloat32, device);
  if (!chunks.empty()) {
    cuda::launch_dependent(cuda::chunk_squares_kernel, static_cast<unsigned int>(chunks.size()), cuda::kChunkThreads,
                           0, stream, table.slots, table.chunks, partials.data<float>());
    WEFT_CUDA_CHECK_LAUNCH();
  }
  const auto blocks = static_cast<unsigned int>((count + cuda::kTensorsPerBlock - 1) / cuda::kTensorsPerBlock);
  cuda::launch_dependent(cuda::tensor_sums_kernel, blocks, 32 * cuda::kTensorsPerBlock, 0, stream, table.slots, count,
                         partials.data<float>(), out.data<float>());
  WEFT_CUDA_CHECK_LAUNCH();
}

namespace {

// scale_in_place's launch, with the factor given or (factor_on_device) read by the kernel.
void scale_tensors(CudaBackend& backend, absl::Span<const Tensor> tensors, double factor,
                   const float* factor_on_device) {
  if (tensors.empty()) return;
  const Device device = tensors[0].device();
  WEFT_CHECK(device.is_cuda(), "scale_in_place: ", tensors[0].describe(), " is not on a CUDA device");
  std::vector<cuda::ScaleSlot> slots;
  std::vector<cuda::ChunkSlot> chunks;
  for (const Tensor& tensor : tensors) {
    WEFT_CHECK(tensor.device() == device, "scale_in_place: ", tensor.describe(), " is not on ", device.to_string(),
               " like ", tensors[0].describe());
    if (!tensor.is_contiguous()) {
      WEFT_CHECK(factor_on_device == nullptr, "clip_to_norm: ", tensor.describe(), " is not contiguous");
      backend.affine(tensor, factor, 0.0, tensor);  // elementwise, so in place is safe
      continue;
    }
    cuda::ScaleSlot slot{};
    slot.data = tensor.raw_data();
    slot.numel = tensor.numel();
    slot.kind = cuda::storage_kind(tensor, "scale_in_place:");
    slot.four_aligned = cuda::four_aligned(tensor);
    cuda::add_chunks(chunks, static_cast<int64_t>(slots.size()), slot.numel);
    slots.push_back(slot);
  }
  if (chunks.empty()) return;
  cuda::set_device(device.index);
  const cuda::DeviceTable<cuda::ScaleSlot> table = cuda::upload_table(slots, chunks, device);
  cuda::launch_dependent(cuda::scale_chunks_kernel, static_cast<unsigned int>(chunks.size()), cuda::kChunkThreads, 0,
                         cuda::current_stream(device.index), table.slots, table.chunks, static_cast<float>(factor),
                         factor_on_device);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::scale_in_place(absl::Span<const Tensor> tensors, double factor) {
  scale_tensors(*this, tensors, factor, nullptr);
}

void CudaBackend::clip_factor(const Tensor& squares, double max_norm, const Tensor& factor) {
  WEFT_CHECK(squares.dim() == 1 && squares.is_contiguous() && squares.dtype() == kFloat32 && squares.device().is_cuda(),
             "clip_factor: squares must be [k] f32, contiguous, on a CUDA device; got ", squares.describe());
  WEFT_CHECK(factor.numel() == 1 && factor.dtype() == kFloat32 && factor.device() == squares.device(),
             "clip_factor: factor must be one f32 element on ", squares.device().to_string(), "; got ",
             factor.describe());
  cuda::set_device(squares.device().index);
  cuda::launch_dependent(cuda::clip_factor_kernel, 1, 1, 0, cuda::current_stream(squares.device().index),
                         squares.data<float>(), squares.size(0), max_norm, factor.data<float>());
  WEFT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::clip_to_norm(absl::Span<const Tensor> tensors, const Tensor& squares, double max_norm) {
  WEFT_CHECK(squares.dim() == 1 && squares.is_contiguous() && squares.dtype() == kFloat32 && squares.device().is_cuda(),
             "clip_to_norm: squares must be [k] f32, contiguous, on a CUDA device; got ", squares.describe());
  if (tensors.empty()) return;
  const Device device = squares.device();
  cuda::set_device(device.index);
  Tensor factor = Tensor::empty({1}, kFloat32, device);
  clip_factor(squares, max_norm, factor);
  scale_tensors(*this, tensors, 1.0, factor.data<float>());
}

}  // namespace weft
