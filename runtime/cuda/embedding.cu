// CUDA kernels: embedding lookup (row gather) and its backward (row scatter-add)
// (CudaBackend::embedding, embedding_backward; the CPU reference is runtime/cpu/embedding.cc).
//
// Forward: one warp per output row copies weight[id] in 16-byte packs. Backward: one warp per
// grad_out row adds it into grad_weight[id] with f32 atomics (rows of repeated ids meet there). A
// bf16/f16 grad_weight is accumulated in an f32 scratch copy [V, C] from the caching allocator and
// rounded once at the end, since bf16 atomic adds would lose the small updates of frequent tokens;
// f32 atomics are 16-byte vector atomics on sm_90. Atomics make the summation order, and so the last
// bits of repeated-id rows, vary between runs. Ids outside [0, V) follow index_check.cuh: a zero
// row forward, a skipped row backward, and weft::Error from the record.
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/index_check.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // 8 rows per block, one per warp
constexpr int kRowsPerBlock = kThreads / 32;

template <class T, class I, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const I* __restrict__ ids,     // [count]
                     const T* __restrict__ weight,  // [vocabulary, columns]
                     T* __restrict__ out,           // [count, columns]
                     int64_t count, int columns, int64_t vocabulary, IndexErrorRecord* record) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int packs = columns / kVec;
  for (int64_t n = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; n < count;
       n += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t id = static_cast<int64_t>(ids[n]);
    T* row_out = out + n * columns;
    if (id < 0 || id >= vocabulary) [[unlikely]] {
      if (lane == 0) record_bad_index(record, IndexedOp::kEmbedding, n, id, vocabulary);
      Pack<T, kVec> zeros;
#pragma unroll
      for (int j = 0; j < kVec; ++j) zeros.set(j, 0.0f);
      for (int p = lane; p < packs; p += 32) store_pack(row_out + p * kVec, zeros);
      continue;
    }
    const T* row = weight + id * columns;
    for (int p = lane; p < packs; p += 32) store_pack(row_out + p * kVec, load_pack<T, kVec>(row + p * kVec));
  }
}

// sum[0..kVec) += values, 16 bytes per atomic where the hardware has them (sm_90) and kVec allows.
template <int kVec>
__device__ __forceinline__ void atomic_add_pack(float* sum, const float (&values)[kVec]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kVectorAtomics = kVec % 4 == 0;
#else
  constexpr bool kVectorAtomics = false;
#endif
  if constexpr (kVectorAtomics) {
#pragma unroll
    for (int q = 0; q < kVec / 4; ++q) {
      atomicAdd(reinterpret_cast<float4*>(sum) + q,
                make_float4(values[4 * q], values[4 * q + 1], values[4 * q + 2], values[4 * q + 3]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) atomicAdd(sum + j, values[j]);
  }
}

// kVec > 1 requires `sums` 16-byte aligned (checked by the launcher).
template <class T, class I, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(const I* __restrict__ ids,       // [count]
                              const T* __restrict__ grad_out,  // [count, columns]
                              float* __restrict__ sums,        // [vocabulary, columns] f32, accumulates
                              int64_t count, int columns, int64_t vocabulary, IndexErrorRecord* record) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int packs = columns / kVec;
  for (int64_t n = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; n < count;
       n += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t id = static_cast<int64_t>(ids[n]);
    if (id < 0 || id >= vocabulary) [[unlikely]] {
      if (lane == 0) record_bad_index(record, IndexedOp::kEmbeddingBackward, n, id, vocabulary);
      continue;
    }
    const T* row = grad_out + n * columns;
    float* row_sums = sums + id * columns;
    for (int p = lane; p < packs; p += 32) {
      const Pack<T, kVec> pack = load_pack_streaming<T, kVec>(row + p * kVec);
      float values[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) values[j] = pack.get(j);
      atomic_add_pack<kVec>(row_sums + p * kVec, values);
    }
  }
}

}  // namespace
}  // namespace cuda

void CudaBackend::embedding(const Tensor& ids, const Tensor& weight, const Tensor& out) {
  cuda::raise_recorded_index_error();
  const int64_t count = ids.numel(), vocabulary = weight.size(0);
  const int columns = static_cast<int>(weight.size(1));
  if (count == 0 || columns == 0) return;
  const int device = weight.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_index(ids.dtype(), "embedding", [&]<class I>() {
    cuda::dispatch_cuda_floating(weight.dtype(), "embedding", [&]<class T>() {
      const T* table = weight.data<T>();
      T* data = out.data<T>();
      cuda::dispatch_pack<T>(cuda::can_use_packs<T>(columns, table, data), [&]<int kVec>() {
        cuda::embedding_kernel<T, I, kVec><<<cuda::grid_for(count, cuda::kRowsPerBlock), cuda::kThreads, 0, stream>>>(
            ids.data<I>(), table, data, count, columns, vocabulary, cuda::index_error_record());
        WEFT_CUDA_CHECK_LAUNCH();
      });
    });
  });
  cuda::finish_index_checked_launch(stream);
}

void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& grad_out, const Tensor& grad_weight) {
  cuda::raise_recorded_index_error();
  const int64_t count = ids.numel(), vocabulary = grad_weight.size(0);
  const int columns = static_cast<int>(grad_weight.size(1));
  if (count == 0 || columns == 0) return;
  const int device = grad_weight.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_index(ids.dtype(), "embedding_backward", [&]<class I>() {
    cuda::dispatch_cuda_floating(grad_weight.dtype(), "embedding_backward", [&]<class T>() {
      // f32 sums: grad_weight itself, or a scratch copy rounded back once at the end.
      Tensor scratch;
      float* sums = nullptr;
      if constexpr (std::is_same_v<T, float>) {
        sums = grad_weight.data<float>();
      } else {
        scratch = Tensor::empty({vocabulary, columns}, kFloat32, grad_weight.device());
        copy(grad_weight, scratch);
        sums = scratch.data<float>();
      }
      const T* gy = grad_out.data<T>();
      cuda::dispatch_pack<T>(cuda::can_use_packs<T>(columns, gy, sums), [&]<int kVec>() {
        cuda::embedding_backward_kernel<T, I, kVec>
            <<<cuda::grid_for(count, cuda::kRowsPerBlock), cuda::kThreads, 0, stream>>>(
                ids.data<I>(), gy, sums, count, columns, vocabulary, cuda::index_error_record());
        WEFT_CUDA_CHECK_LAUNCH();
      });
      if (scratch.defined()) copy(scratch, grad_weight);
    });
  });
  cuda::finish_index_checked_launch(stream);
}

}  // namespace weft
