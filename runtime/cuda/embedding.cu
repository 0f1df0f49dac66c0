// CUDA kernels: embedding lookup (row gather) and its backward (row scatter-add)
// (CudaBackend::embedding, embedding_backward; the CPU reference is runtime/cpu/embedding.cc).
//
// Forward: one warp per output row copies weight[id] in 16-byte packs. Backward: the ids are sorted
// with their positions (CUB's radix sort over the bits the vocabulary needs, 16 for GPT-2's), then
// one warp per run of equal ids and chunk of columns sums the run's grad_out rows in f32 and adds
// the sum into grad_weight[id] once, rounded once. So the backward reads grad_out once and only the
// rows of grad_weight that the batch names, needs no [V, C] f32 scratch, and gives the same bits on
// every run. (An earlier version accumulated with f32 atomics into such a scratch, copied in and
// out: GPT-2's embedding backward node took 527 us a step that way and takes 78 us now, see
// docs/performance.md.) A very frequent id is summed by one warp per column chunk (16 bytes a
// lane, eight rows in flight): with GPT-2's ids drawn as Zipf's law has them (the most frequent
// about 9% of a batch of 16384) the kernel takes 308 us where evenly spread ids take 67 us, that
// one run's warps working alone at the end; splitting long runs over several warps, with their
// partial sums added in order, is what would even it out. Ids outside [0, V) follow
// index_check.cuh: a zero row forward, a skipped row backward (they sort last), and weft::Error
// from the record.
#include <cub/device/device_radix_sort.cuh>

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
constexpr int kRowsInFlight = 8;  // backward: grad_out rows of one run loaded before any is added

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

// Backward, first kernel: the sort's keys (the id, or `vocabulary` for a bad id, which sorts last and
// is skipped) and values (the row's position).
template <class I>
__global__ void embedding_sort_keys_kernel(const I* __restrict__ ids,  // [count]
                                           int32_t* __restrict__ keys, int32_t* __restrict__ positions,
                                           int64_t count, int64_t vocabulary, IndexErrorRecord* record) {
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < count;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[n]);
    const bool valid = id >= 0 && id < vocabulary;
    if (!valid) [[unlikely]] record_bad_index(record, IndexedOp::kEmbeddingBackward, n, id, vocabulary);
    keys[n] = static_cast<int32_t>(valid ? id : vocabulary);
    positions[n] = static_cast<int32_t>(n);
  }
}

// Backward, after the sort: one warp per (sorted index, chunk of 32 * kVec columns). The warp at the
// first index of a run of equal ids sums the run's grad_out rows in f32, in sorted order (the sort is
// stable, so in position order), and adds the sum into grad_weight[id] once; the other warps return.
// No two warps write one element, so there are no atomics and the bits are the same on every run.
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_sorted_kernel(const int32_t* __restrict__ keys,       // [count] sorted ids
                                     const int32_t* __restrict__ positions,  // [count] their rows
                                     const T* __restrict__ grad_out,         // [count, columns]
                                     T* __restrict__ grad_weight,            // [vocabulary, columns]
                                     int64_t count, int columns, int64_t vocabulary) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int column = (static_cast<int>(blockIdx.y) * 32 + lane) * kVec;
  const bool active = column < columns;
  for (int64_t start = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; start < count;
       start += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int32_t key = keys[start];
    if (key >= vocabulary || (start > 0 && keys[start - 1] == key)) continue;
    // The run's end: 32 keys a ballot.
    int64_t end = start + 1;
    while (true) {
      const int64_t next = end + lane;
      const unsigned int same = __ballot_sync(0xffffffffu, next < count && keys[next] == key);
      if (same == 0xffffffffu) {
        end += 32;
        continue;
      }
      end += __ffs(~same) - 1;
      break;
    }
    // 32 positions at a time, one a lane, handed round by shuffles: the row loads do not wait for
    // a position load each, and eight rows are in flight. Rows are added in sorted order.
    float sums[kVec] = {};
    for (int64_t base = start; base < end; base += 32) {
      const int count_here = static_cast<int>(end - base < 32 ? end - base : 32);
      const int32_t my_position = lane < count_here ? positions[base + lane] : 0;
      int k = 0;
      for (; k + kRowsInFlight <= count_here; k += kRowsInFlight) {
        Pack<T, kVec> packs[kRowsInFlight];
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          const int64_t position = __shfl_sync(0xffffffffu, my_position, k + u);
          if (active) packs[u] = load_pack_streaming<T, kVec>(grad_out + position * columns + column);
        }
        if (active) {
#pragma unroll
          for (int u = 0; u < kRowsInFlight; ++u) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) sums[j] += packs[u].get(j);
          }
        }
      }
      for (; k < count_here; ++k) {
        const int64_t position = __shfl_sync(0xffffffffu, my_position, k);
        if (!active) continue;
        const Pack<T, kVec> pack = load_pack_streaming<T, kVec>(grad_out + position * columns + column);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sums[j] += pack.get(j);
      }
    }
    if (!active) continue;
    T* row = grad_weight + static_cast<int64_t>(key) * columns + column;
    Pack<T, kVec> pack = load_pack<T, kVec>(row);
#pragma unroll
    for (int j = 0; j < kVec; ++j) pack.set(j, pack.get(j) + sums[j]);
    store_pack(row, pack);
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
  WEFT_CHECK(count < (int64_t{1} << 31) && vocabulary < (int64_t{1} << 31) - 1, "embedding_backward: ", count,
             " ids into a vocabulary of ", vocabulary, " exceed the 32-bit sort keys; split the batch");
  const int device = grad_weight.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  // Keys and positions before and after the sort, and the sort's own temporary storage, in one
  // allocation from the caching allocator (positions as i32 is why count must stay below 2^31).
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= vocabulary) ++end_bit;  // `vocabulary` itself (bad ids) fits
  size_t sort_bytes = 0;
  WEFT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr), count, 0, end_bit, stream));
  const int64_t sort_words = (static_cast<int64_t>(sort_bytes) + 15) / 16 * 4;
  const Tensor scratch = Tensor::empty({4 * count + sort_words + 4}, kInt32, grad_weight.device());
  int32_t* keys = scratch.data<int32_t>();
  int32_t* positions = keys + count;
  int32_t* sorted_keys = positions + count;
  int32_t* sorted_positions = sorted_keys + count;
  void* sort_storage = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(sorted_positions + count) + 15) / 16 * 16);
  cuda::dispatch_cuda_index(ids.dtype(), "embedding_backward", [&]<class I>() {
    cuda::embedding_sort_keys_kernel<I><<<cuda::grid_for(count, cuda::kThreads), cuda::kThreads, 0, stream>>>(
        ids.data<I>(), keys, positions, count, vocabulary, cuda::index_error_record());
    WEFT_CUDA_CHECK_LAUNCH();
  });
  WEFT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, keys, sorted_keys, positions,
                                                  sorted_positions, count, 0, end_bit, stream));
  cuda::dispatch_cuda_floating(grad_weight.dtype(), "embedding_backward", [&]<class T>() {
    const T* gy = grad_out.data<T>();
    T* gw = grad_weight.data<T>();
    cuda::dispatch_pack<T>(cuda::can_use_packs<T>(columns, gy, gw), [&]<int kVec>() {
      const unsigned int column_chunks = static_cast<unsigned int>((columns + 32 * kVec - 1) / (32 * kVec));
      const dim3 grid(cuda::grid_for(count, cuda::kRowsPerBlock), column_chunks);
      cuda::embedding_backward_sorted_kernel<T, kVec><<<grid, cuda::kThreads, 0, stream>>>(
          sorted_keys, sorted_positions, gy, gw, count, columns, vocabulary);
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
  cuda::finish_index_checked_launch(stream);
}

}  // namespace weft
