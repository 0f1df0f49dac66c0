// CUDA kernels: embedding lookup (row gather) and its backward (row scatter-add)
// (CudaBackend::embedding, embedding_backward; the CPU reference is runtime/cpu/embedding.cc).
//
// Forward: one warp per output row copies weight[id] in 16-byte packs. Backward: the ids are sorted
// with their positions (CUB's radix sort over the bits the vocabulary needs, 16 for GPT-2's), then
// warps per run of equal ids and chunk of columns sum the run's grad_out rows in f32 and add the
// sum into grad_weight[id] once, rounded once. So the backward reads grad_out once and only the
// rows of grad_weight that the batch names, needs no [V, C] f32 scratch, and gives the same bits on
// every run. (An earlier version accumulated with f32 atomics into such a scratch, copied in and
// out: GPT-2's embedding backward node took 527 us a step that way and takes 78 us now, see
// docs/performance.md.) A frequent id's run is cut into parts of 64 sorted rows, each summed by
// its own warps, and a second kernel adds the parts' f32 sums in order: summed by one warp per
// column chunk, the most frequent id of Zipf-distributed ids (about 9% of a batch of 16384) kept
// its warps working alone at the end (308 us against 67 us for evenly spread ids). Ids outside
// [0, V) follow index_check.cuh: a zero row forward, a skipped row backward (they sort last), and
// weft::Error from the record.
#include <cub/device/device_radix_sort.cuh>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
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
constexpr int64_t kPartRows = 64;  // backward: the most sorted rows one warp sums (a run is split)

template <class T, class I, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const I* __restrict__ ids,     // [count]
                     const T* __restrict__ weight,  // [vocabulary, columns]
                     T* __restrict__ out,           // [count, columns]
                     int64_t count, int columns, int64_t vocabulary, IndexErrorRecord* record) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
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
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < count;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[n]);
    const bool valid = id >= 0 && id < vocabulary;
    if (!valid) [[unlikely]] record_bad_index(record, IndexedOp::kEmbeddingBackward, n, id, vocabulary);
    keys[n] = static_cast<int32_t>(valid ? id : vocabulary);
    positions[n] = static_cast<int32_t>(n);
  }
}

// Backward, after the sort, cut into parts of at most kPartRows sorted rows so that no warp sums a
// whole long run: a run of equal ids is split where it crosses a multiple of kPartRows. One warp
// per (sorted index, chunk of 32 * kVec columns); the warp at a run's first index, or at a multiple
// of kPartRows inside a run, sums its part's grad_out rows in f32, in sorted (so position) order.
// A part that is its whole run adds its sum into grad_weight[id] at once. A part of a longer run
// writes its sum to `partials` [segments, 2, columns] f32 (segment = index / kPartRows; slot 0: the
// part that continues a run begun in an earlier segment, slot 1: the part that starts a run that
// goes on past this segment) for embedding_backward_merge_kernel. No two warps write one element,
// so there are no atomics and the bits are the same on every run.
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_sorted_kernel(const int32_t* __restrict__ keys,       // [count] sorted ids
                                     const int32_t* __restrict__ positions,  // [count] their rows
                                     const T* __restrict__ grad_out,         // [count, columns]
                                     T* __restrict__ grad_weight,            // [vocabulary, columns]
                                     float* __restrict__ partials,           // [segments, 2, columns]
                                     int64_t count, int columns, int64_t vocabulary) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int column = (static_cast<int>(blockIdx.y) * 32 + lane) * kVec;
  const bool active = column < columns;
  for (int64_t start = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; start < count;
       start += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int32_t key = keys[start];
    if (key >= vocabulary) continue;
    const bool run_start = start == 0 || keys[start - 1] != key;
    if (!run_start && start % kPartRows != 0) continue;
    // The part's end: the run's end or the segment's, whichever comes first; 32 keys a ballot.
    const int64_t segment = start / kPartRows;
    const int64_t segment_end = (segment + 1) * kPartRows < count ? (segment + 1) * kPartRows : count;
    int64_t end = start + 1;
    while (end < segment_end) {
      const int64_t next = end + lane;
      const unsigned int same = __ballot_sync(0xffffffffu, next < segment_end && keys[next] == key);
      if (same == 0xffffffffu) {
        end += 32;
        continue;
      }
      end += __ffs(~same) - 1;
      break;
    }
    const bool goes_on = end == segment_end && end < count && keys[end] == key;
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
    if (run_start && !goes_on) {
      T* row = grad_weight + static_cast<int64_t>(key) * columns + column;
      Pack<T, kVec> pack = load_pack<T, kVec>(row);
#pragma unroll
      for (int j = 0; j < kVec; ++j) pack.set(j, pack.get(j) + sums[j]);
      store_pack(row, pack);
      continue;
    }
    float* partial = partials + (segment * 2 + (run_start ? 1 : 0)) * columns + column;
#pragma unroll
    for (int j = 0; j < kVec; ++j) partial[j] = sums[j];
  }
}

// Backward, last: one warp per (segment, column chunk) whose last run starts in it and goes on past
// its end adds that run's partial sums, segment by segment in order, into grad_weight[id] once.
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_merge_kernel(const int32_t* __restrict__ keys,    // [count] sorted ids
                                    const float* __restrict__ partials,  // [segments, 2, columns]
                                    T* __restrict__ grad_weight,         // [vocabulary, columns]
                                    int64_t count, int64_t segments, int columns, int64_t vocabulary) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int column = (static_cast<int>(blockIdx.y) * 32 + lane) * kVec;
  if (column >= columns) return;
  for (int64_t segment = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32; segment < segments;
       segment += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t segment_end = (segment + 1) * kPartRows;
    if (segment_end >= count) continue;  // the last segment: no run goes on past it
    const int32_t key = keys[segment_end - 1];
    if (key >= vocabulary || keys[segment_end] != key) continue;
    // Sorted keys: if the key just before the segment is the run's, the run began in an earlier
    // segment, whose warp merges it.
    if (segment > 0 && keys[segment * kPartRows - 1] == key) continue;
    float sums[kVec];
    const float* first = partials + (segment * 2 + 1) * columns + column;
#pragma unroll
    for (int j = 0; j < kVec; ++j) sums[j] = first[j];
    for (int64_t next = segment + 1;; ++next) {
      const float* part = partials + next * 2 * columns + column;  // slot 0: the run continued
#pragma unroll
      for (int j = 0; j < kVec; ++j) sums[j] += part[j];
      const int64_t next_end = (next + 1) * kPartRows;
      if (next_end >= count || keys[next_end] != key) break;
    }
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
        cuda::launch_dependent(cuda::embedding_kernel<T, I, kVec>, cuda::grid_for(count, cuda::kRowsPerBlock),
                               cuda::kThreads, 0, stream, ids.data<I>(), table, data, count, columns, vocabulary,
                               cuda::index_error_record());
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
  // Partial sums of runs split at part boundaries, only written where a run crosses one (f32,
  // 2 * 768 * 4 bytes a segment of 64 ids at GPT-2's width: 1.5 MB for its batch of 16384).
  const int64_t segments = (count + cuda::kPartRows - 1) / cuda::kPartRows;
  const Tensor partials = Tensor::empty({segments * 2 * columns}, kFloat32, grad_weight.device());
  cuda::dispatch_cuda_index(ids.dtype(), "embedding_backward", [&]<class I>() {
    cuda::launch_dependent(cuda::embedding_sort_keys_kernel<I>, cuda::grid_for(count, cuda::kThreads), cuda::kThreads,
                           0, stream, ids.data<I>(), keys, positions, count, vocabulary, cuda::index_error_record());
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
      cuda::launch_dependent(cuda::embedding_backward_sorted_kernel<T, kVec>, grid, cuda::kThreads, 0, stream,
                             sorted_keys, sorted_positions, gy, gw, partials.data<float>(), count, columns,
                             vocabulary);
      WEFT_CUDA_CHECK_LAUNCH();
      // Only runs longer than a part need it; the host cannot know without a read back, and a
      // launch over segments whose warps return at once costs a few microseconds.
      const dim3 merge_grid(cuda::grid_for(segments, cuda::kRowsPerBlock), column_chunks);
      cuda::launch_dependent(cuda::embedding_backward_merge_kernel<T, kVec>, merge_grid, cuda::kThreads, 0, stream,
                             sorted_keys, partials.data<float>(), gw, count, segments, columns, vocabulary);
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
  cuda::finish_index_checked_launch(stream);
}

}  // namespace weft
