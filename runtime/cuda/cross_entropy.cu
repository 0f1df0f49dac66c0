// CUDA kernels: cross-entropy fused with the softmax over the vocabulary, forward and backward
// (CudaBackend::cross_entropy, cross_entropy_backward, cross_entropy_with_gradient; the CPU reference is
// runtime/cpu/cross_entropy.cc).
//
// cross_entropy_with_gradient runs both in one kernel: each row read once from memory and written
// once, where the two kernels read it twice. A row of up to 112 KB (GPT-2's and Llama 2's
// vocabularies in bf16) is kept in shared memory between the kernel's two passes; a longer one is
// read a second time, from L2.
//
// Forward: one block per row reads the logits once, in 16-byte packs, keeping each thread's running
// (maximum, sum of exp) online; a block merge gives lse = max + log(sum), and
// loss = lse - logit[target] (0 for ignore_index). Backward: one block per row reads the logits once
// more and writes grad = (exp(logit - lse) - onehot(target)) * grad_losses[n] in the logits' dtype;
// ignored rows are written as zeros without reading; the gradient may overwrite the logits (each
// thread reads its packs before writing them, and no thread reads another's). Nothing of size
// [N, V] is stored but the gradient itself: no f32 copy of the logits, no probabilities. Math is
// f32. Targets outside [0, V) that are not ignore_index follow index_check.cuh: a NaN loss forward,
// a zero gradient row backward, and weft::Error from the record.
//
// On Hopper (sm_90 code on a device of compute capability 9.0 or later) rows of 4 KB to 112 KB take
// cross_entropy_with_gradient_bulk_kernel instead: one block a multiprocessor with two rows in
// shared memory, the next one copied in by the copy engine while the block works on the current
// one (see the kernel).
//
// Speed: every exponential is exp_shifted (row_kernels.cuh: one MUFU.EX2), because with exp2f the
// forward was issue-bound. Each byte of the logits is used once per kernel and the tensor is far
// larger than L2. The forward keeps 8 packs a thread in flight (all loaded before the first is used)
// in blocks of at most 256 threads, and reads with load_pack_once (non-coherent, no L1 allocation,
// 256-byte L2 fetches): on the H200 ([8192, 50304] bf16, docs/performance.md) that runs at 93-94%
// of copy bandwidth, the former kernel (exp2f, 4 packs, 512 threads, evict-first loads) at 63-71%. The
// backward, which also writes, keeps 4 packs in flight in blocks of at most 512 threads, with
// evict-first loads and stores: 96% of copy. The bulk kernel: 579.7 µs against the resident
// kernel's 593.5 at [8192, 50304] bf16 on an H100 (94% of copy against 92%; docs/performance.md,
// 2026-12-07, thirty-third session).
#include <algorithm>
#include <cmath>

#include "runtime/cuda/bulk_copy.cuh"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/dynamic_shared_memory.cuh"
#include "runtime/cuda/index_check.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

// Packs each thread loads before using the first (loads in flight), and the most threads per block.
constexpr int kForwardUnroll = 8;
constexpr int kForwardThreads = 256;
constexpr int kBackwardUnroll = 4;
constexpr int kBackwardThreads = 512;

template <class T, int kVec>
__device__ __forceinline__ void accumulate(MaxSum& state, const Pack<T, kVec>& pack) {
  float pack_maximum = -INFINITY;
#pragma unroll
  for (int j = 0; j < kVec; ++j) pack_maximum = fmaxf(pack_maximum, pack.get(j));
  if (pack_maximum == -INFINITY) return;  // adds nothing
  if (pack_maximum > state.maximum) {
    state.sum *= exp_shifted(state.maximum, pack_maximum);
    state.maximum = pack_maximum;
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) state.sum += exp_shifted(pack.get(j), state.maximum);
}

// A row's lse and loss, written by one thread once the block has merged the row: the loss is
// lse - the target's logit, 0 for ignore_index, and NaN (with the bad target recorded) for a
// target outside [0, vocabulary). `target_logit` matters only for a valid target.
__device__ __forceinline__ void write_row_loss(int64_t row, float row_lse, int64_t target, float target_logit,
                                               int vocabulary, int64_t ignore_index, float* losses, float* lse,
                                               IndexErrorRecord* record) {
  lse[row] = row_lse;
  float loss = 0.0f;
  if (target != ignore_index) {
    if (target >= 0 && target < vocabulary) [[likely]] {
      loss = row_lse - target_logit;
    } else {
      record_bad_index(record, IndexedOp::kCrossEntropy, row, target, vocabulary, ignore_index);
      loss = NAN;
    }
  }
  losses[row] = loss;
}

template <class T, class I, int kVec>
__global__ void __launch_bounds__(kForwardThreads)
    cross_entropy_kernel(const T* __restrict__ logits,   // [rows, vocabulary]
                         const I* __restrict__ targets,  // [rows]
                         float* __restrict__ losses,     // [rows]
                         float* __restrict__ lse,        // [rows]
                         int64_t rows, int vocabulary, int64_t ignore_index, IndexErrorRecord* record) {
  __shared__ float scratch[64];
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int packs = vocabulary / kVec;
  const int threads = static_cast<int>(blockDim.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* row_in = logits + row * vocabulary;
    MaxSum state{-INFINITY, 0.0f};
    int p = static_cast<int>(threadIdx.x);
    for (; p + (kForwardUnroll - 1) * threads < packs; p += kForwardUnroll * threads) {
      Pack<T, kVec> loaded[kForwardUnroll];
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) loaded[u] = load_pack_once<T, kVec>(row_in + (p + u * threads) * kVec);
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) accumulate(state, loaded[u]);
    }
    for (; p < packs; p += threads) accumulate(state, load_pack_once<T, kVec>(row_in + p * kVec));
    state = block_merge(state, scratch);
    if (threadIdx.x == 0) {
      const int64_t target = static_cast<int64_t>(targets[row]);
      const bool valid = target >= 0 && target < vocabulary;
      write_row_loss(row, state.maximum + logf(state.sum), target, valid ? to_float(row_in[target]) : 0.0f,
                     vocabulary, ignore_index, losses, lse, record);
    }
  }
}

template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> gradient_pack(const Pack<T, kVec>& pack, int first_column, int64_t target,
                                                       float row_lse, float grad_loss) {
  Pack<T, kVec> result;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float probability = exp_shifted(pack.get(j), row_lse);
    result.set(j, (probability - (first_column + j == target ? 1.0f : 0.0f)) * grad_loss);
  }
  return result;
}

// Writes one row's gradient, (softmax - onehot(target)) * grad_loss, reading the row's logits from
// row_in (kBackwardUnroll packs a thread in flight, evict-first loads and stores). The block's
// threads take packs threadIdx.x, threadIdx.x + blockDim.x, ...; row_out may be row_in: a thread
// reads each of its packs before it writes it, and no thread reads another's.
template <class T, int kVec>
__device__ __forceinline__ void write_gradient_row(const T* row_in, T* row_out, int packs, int64_t target,
                                                   float row_lse, float grad_loss) {
  const int threads = static_cast<int>(blockDim.x);
  int p = static_cast<int>(threadIdx.x);
  for (; p + (kBackwardUnroll - 1) * threads < packs; p += kBackwardUnroll * threads) {
    Pack<T, kVec> loaded[kBackwardUnroll];
#pragma unroll
    for (int u = 0; u < kBackwardUnroll; ++u) {
      loaded[u] = load_pack_streaming<T, kVec>(row_in + (p + u * threads) * kVec);
    }
#pragma unroll
    for (int u = 0; u < kBackwardUnroll; ++u) {
      const int column = (p + u * threads) * kVec;
      store_pack_streaming(row_out + column, gradient_pack(loaded[u], column, target, row_lse, grad_loss));
    }
  }
  for (; p < packs; p += threads) {
    const Pack<T, kVec> pack = load_pack_streaming<T, kVec>(row_in + p * kVec);
    store_pack_streaming(row_out + p * kVec, gradient_pack(pack, p * kVec, target, row_lse, grad_loss));
  }
}

// Writes zeros over one row's gradient (an ignored or out-of-range target), reading nothing.
template <class T, int kVec>
__device__ __forceinline__ void write_zero_row(T* row_out, int packs) {
  Pack<T, kVec> zeros;
#pragma unroll
  for (int j = 0; j < kVec; ++j) zeros.set(j, 0.0f);
  for (int p = static_cast<int>(threadIdx.x); p < packs; p += static_cast<int>(blockDim.x)) {
    store_pack_streaming(row_out + p * kVec, zeros);
  }
}

template <class T, class I, int kVec>
__global__ void __launch_bounds__(kBackwardThreads)
    cross_entropy_backward_kernel(const T* logits,                      // [rows, vocabulary]
                                  const I* __restrict__ targets,        // [rows]
                                  const float* __restrict__ lse,        // [rows]
                                  const float* __restrict__ grad_losses,  // [rows]
                                  T* grad_logits,                       // [rows, vocabulary], may be logits
                                  int64_t rows, int vocabulary, int64_t ignore_index, IndexErrorRecord* record) {
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int packs = vocabulary / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* row_in = logits + row * vocabulary;
    T* row_out = grad_logits + row * vocabulary;
    const int64_t target = static_cast<int64_t>(targets[row]);
    const bool valid = target >= 0 && target < vocabulary;
    if (target == ignore_index || !valid) {
      if (target != ignore_index && threadIdx.x == 0) {
        record_bad_index(record, IndexedOp::kCrossEntropyBackward, row, target, vocabulary, ignore_index);
      }
      write_zero_row<T, kVec>(row_out, packs);
      continue;
    }
    write_gradient_row<T, kVec>(row_in, row_out, packs, target, lse[row], grad_losses[row]);
  }
}

// Forward and backward in one kernel (CudaBackend::cross_entropy_with_gradient): one block per row
// (grid-stride) reads the row once for its lse and loss, as cross_entropy_kernel, then writes the
// gradient, as cross_entropy_backward_kernel with grad_losses. kResident: the first pass keeps each
// pack it reads in shared memory (dynamic, the row's bytes) and the second pass reads them from
// there, so the row crosses from memory once and is written once, the least traffic there is; for
// rows of up to kResidentRowBytes (GPT-2's vocabulary of 50304 in bf16 is 100.6 KB: two blocks a
// multiprocessor, one loading while the other merges and writes; Llama 2's 32000 is 64 KB: three).
// Otherwise the second pass reads the row again, and the grid is capped at a few blocks per
// multiprocessor so that the rows in flight stay in L2 between the two reads. In place
// (grad_logits == logits) is safe either way: every read of a row (the target's logit included)
// precedes the block merge, which synchronizes the block, and every write follows it; without
// kResident each thread reads back only the packs it read before.
constexpr int kResidentRowBytes = 112 * 1024;
// The row and the block's 256 bytes of static scratch within the 227 KB a block of an H100 or H200
// may opt into (sm_90, the CUDA build's default target; the norm backward assumes the same bound).
static_assert(kResidentRowBytes + 256 <= 227 * 1024, "a resident row fits in an H100/H200 block");

template <class T, class I, int kVec, bool kResident>
__global__ void __launch_bounds__(kBackwardThreads)
    cross_entropy_with_gradient_kernel(const T* logits,                        // [rows, vocabulary]
                                       const I* __restrict__ targets,          // [rows]
                                       const float* __restrict__ grad_losses,  // [rows]
                                       float* __restrict__ losses,             // [rows]
                                       float* __restrict__ lse,                // [rows]
                                       T* grad_logits,  // [rows, vocabulary], may be logits
                                       int64_t rows, int vocabulary, int64_t ignore_index,
                                       IndexErrorRecord* record) {
  extern __shared__ __align__(16) unsigned char row_storage[];
  Pack<T, kVec>* const row_packs = reinterpret_cast<Pack<T, kVec>*>(row_storage);  // [packs] if kResident
  __shared__ float scratch[64];
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  const int packs = vocabulary / kVec;
  const int threads = static_cast<int>(blockDim.x);
  // The first pass's load: kept in shared memory, or left in L2 for the second pass.
  const auto load = [&](const T* row_in, int p) {
    if constexpr (kResident) {
      const Pack<T, kVec> pack = load_pack_once<T, kVec>(row_in + p * kVec);
      row_packs[p] = pack;
      return pack;
    } else {
      return load_pack<T, kVec>(row_in + p * kVec);
    }
  };
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* row_in = logits + row * vocabulary;
    T* row_out = grad_logits + row * vocabulary;
    const int64_t target = static_cast<int64_t>(targets[row]);
    const bool valid = target >= 0 && target < vocabulary;
    const bool counted = target != ignore_index && valid;
    // Read before the merge: the second pass may overwrite it (from shared memory once it is there).
    float target_logit = 0.0f;
    if constexpr (!kResident) target_logit = threadIdx.x == 0 && counted ? to_float(row_in[target]) : 0.0f;
    MaxSum state{-INFINITY, 0.0f};
    int p = static_cast<int>(threadIdx.x);
    for (; p + (kBackwardUnroll - 1) * threads < packs; p += kBackwardUnroll * threads) {
      Pack<T, kVec> loaded[kBackwardUnroll];
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) loaded[u] = load(row_in, p + u * threads);
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) accumulate(state, loaded[u]);
    }
    for (; p < packs; p += threads) accumulate(state, load(row_in, p));
    state = block_merge(state, scratch);  // its barriers also make row_packs whole for every thread
    const float row_lse = state.maximum + logf(state.sum);
    if (threadIdx.x == 0) {
      if constexpr (kResident) {
        if (counted) target_logit = row_packs[target / kVec].get(static_cast<int>(target % kVec));
      }
      write_row_loss(row, row_lse, target, target_logit, vocabulary, ignore_index, losses, lse, record);
    }
    if (!counted) {
      write_zero_row<T, kVec>(row_out, packs);
    } else if constexpr (kResident) {
      const float grad_loss = grad_losses[row];
      for (p = static_cast<int>(threadIdx.x); p < packs; p += threads) {
        store_pack_streaming(row_out + p * kVec, gradient_pack(row_packs[p], p * kVec, target, row_lse, grad_loss));
      }
    } else {
      write_gradient_row<T, kVec>(row_in, row_out, packs, target, row_lse, grad_losses[row]);
    }
    if constexpr (kResident) __syncthreads();  // the next row's first pass overwrites row_packs
  }
}

// cross_entropy_with_gradient_kernel's work on Hopper, where the copy engine loads the rows: one
// block per multiprocessor (grid-stride over rows) keeps two rows in shared memory, the next one
// landing (bulk copies, bulk_copy.cuh) while it takes the current one's lse and writes its gradient.
// The resident kernel's threads stop loading while they compute, so its blocks left memory idle
// between rows: 76% of copy bandwidth on the H200 (docs/performance.md, 2026-12-03). Each row comes
// in kBulkChunks copies, each on its own barrier, so that the first pass starts on the row's first
// chunk. A buffer is loaded again only after the whole block has finished reading it (the row's
// last __syncthreads, then a proxy fence). In place is safe: the copies read other rows than the
// gradient being written, and a row's own target logit is read from shared memory.
// Shared memory (dynamic): two rows of vocabulary / kVec packs, each of kBulkRowBytes at most.
constexpr int kBulkThreads = 1024;
constexpr int kBulkChunks = 4;
constexpr int kBulkRowBytes = 112 * 1024;
static_assert(2 * kBulkRowBytes + 1024 <= 227 * 1024, "two rows fit in an H100/H200 block");

template <class T, class I, int kVec>
__global__ void __launch_bounds__(kBulkThreads, 1)
    cross_entropy_with_gradient_bulk_kernel(const T* logits,                        // [rows, vocabulary]
                                            const I* __restrict__ targets,          // [rows]
                                            const float* __restrict__ grad_losses,  // [rows]
                                            float* __restrict__ losses,             // [rows]
                                            float* __restrict__ lse,                // [rows]
                                            T* grad_logits,  // [rows, vocabulary], may be logits
                                            int64_t rows, int vocabulary, int64_t ignore_index,
                                            IndexErrorRecord* record) {
  using RowPack = Pack<T, kVec>;
  extern __shared__ __align__(128) unsigned char row_storage[];
  __shared__ uint64_t loaded[2][kBulkChunks];  // [buffer, chunk]: a chunk of the buffer's row has landed
  __shared__ float scratch[64];
  const int packs = vocabulary / kVec;
  const int chunk_packs = (packs + kBulkChunks - 1) / kBulkChunks;  // every chunk has packs: see the launch
  RowPack* const buffers = reinterpret_cast<RowPack*>(row_storage);  // [2, packs]: buffer b at b * packs
  const int threads = static_cast<int>(blockDim.x);
  const int64_t stride = gridDim.x;
  if (threadIdx.x == 0) {
    for (int buffer = 0; buffer < 2; ++buffer) {
      for (int chunk = 0; chunk < kBulkChunks; ++chunk) bulk::barrier_init(&loaded[buffer][chunk], 1);
    }
    bulk::fence_barrier_init();
  }
  __syncthreads();
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  // Thread 0 has `row` copied into `buffer`, chunk by chunk.
  const auto load = [&](int buffer, int64_t row) {
    const RowPack* source = reinterpret_cast<const RowPack*>(logits + row * vocabulary);
    for (int chunk = 0; chunk < kBulkChunks; ++chunk) {
      const int first = chunk * chunk_packs;
      const auto bytes = static_cast<uint32_t>(min(chunk_packs, packs - first) * sizeof(RowPack));
      bulk::arrive_expecting(&loaded[buffer][chunk], bytes);
      bulk::copy_to_shared(buffers + buffer * packs + first, source + first, bytes, &loaded[buffer][chunk]);
    }
  };
  if (threadIdx.x == 0) {
    if (blockIdx.x < rows) load(0, blockIdx.x);
    if (blockIdx.x + stride < rows) load(1, blockIdx.x + stride);
  }
  int iteration = 0;
  for (int64_t row = blockIdx.x; row < rows; row += stride, ++iteration) {
    const int buffer = iteration % 2;
    const auto parity = static_cast<uint32_t>((iteration / 2) % 2);  // the buffer's use count, mod 2
    const RowPack* const row_packs = buffers + buffer * packs;
    const int64_t target = static_cast<int64_t>(targets[row]);
    const bool counted = target != ignore_index && target >= 0 && target < vocabulary;
    // The first pass: each thread's packs threadIdx.x, threadIdx.x + threads, ..., chunk by chunk.
    MaxSum state{-INFINITY, 0.0f};
    for (int chunk = 0; chunk < kBulkChunks; ++chunk) {
      bulk::wait(&loaded[buffer][chunk], parity);
      const int first = chunk * chunk_packs, end = min(first + chunk_packs, packs);
      int p = static_cast<int>(threadIdx.x);
      if (p < first) p += (first - p + threads - 1) / threads * threads;
#pragma unroll 4
      for (; p < end; p += threads) accumulate(state, row_packs[p]);
    }
    state = block_merge(state, scratch);
    const float row_lse = state.maximum + logf(state.sum);
    if (threadIdx.x == 0) {
      const float target_logit = counted ? row_packs[target / kVec].get(static_cast<int>(target % kVec)) : 0.0f;
      write_row_loss(row, row_lse, target, target_logit, vocabulary, ignore_index, losses, lse, record);
    }
    T* row_out = grad_logits + row * vocabulary;
    if (!counted) {
      write_zero_row<T, kVec>(row_out, packs);
    } else {
      const float grad_loss = grad_losses[row];
#pragma unroll 4
      for (int p = static_cast<int>(threadIdx.x); p < packs; p += threads) {
        store_pack_streaming(row_out + p * kVec, gradient_pack(row_packs[p], p * kVec, target, row_lse, grad_loss));
      }
    }
    __syncthreads();  // every thread is done reading this buffer
    if (threadIdx.x == 0 && row + 2 * stride < rows) {
      bulk::fence_before_copy_over_read_memory();
      load(buffer, row + 2 * stride);
    }
  }
}

// Threads per block for rows of `packs` packs, at most `max_threads` (the kernel's launch bound):
// fewer for short rows, so that small vocabularies do not idle most of a block.
int threads_for(int packs, int max_threads) {
  if (packs >= max_threads * 2) return max_threads;
  return std::min(max_threads, packs >= 512 ? 256 : 128);
}

}  // namespace
}  // namespace cuda

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                const Tensor& losses, const Tensor& lse) {
  cuda::raise_recorded_index_error();
  const int64_t rows = logits.size(0);
  const int vocabulary = static_cast<int>(logits.size(1));
  if (rows == 0) return;
  const int device = logits.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_index(targets.dtype(), "cross_entropy", [&]<class I>() {
    cuda::dispatch_cuda_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
      const T* data = logits.data<T>();
      cuda::dispatch_pack<T>(cuda::can_use_packs<T>(vocabulary, data), [&]<int kVec>() {
        cuda::launch_dependent(cuda::cross_entropy_kernel<T, I, kVec>, cuda::grid_for(rows, 1),
                               cuda::threads_for(vocabulary / kVec, cuda::kForwardThreads), 0, stream, data,
                               targets.data<I>(), losses.data<float>(), lse.data<float>(), rows, vocabulary,
                               ignore_index, cuda::index_error_record());
        WEFT_CUDA_CHECK_LAUNCH();
      });
    });
  });
  cuda::finish_index_checked_launch(stream);
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                         int64_t ignore_index, const Tensor& grad_losses, const Tensor& grad_logits) {
  cuda::raise_recorded_index_error();
  const int64_t rows = logits.size(0);
  const int vocabulary = static_cast<int>(logits.size(1));
  if (rows == 0 || vocabulary == 0) return;
  const int device = logits.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  cuda::dispatch_cuda_index(targets.dtype(), "cross_entropy_backward", [&]<class I>() {
    cuda::dispatch_cuda_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
      const T* data = logits.data<T>();
      T* out = grad_logits.data<T>();
      cuda::dispatch_pack<T>(cuda::can_use_packs<T>(vocabulary, data, out), [&]<int kVec>() {
        cuda::launch_dependent(cuda::cross_entropy_backward_kernel<T, I, kVec>, cuda::grid_for(rows, 1),
                               cuda::threads_for(vocabulary / kVec, cuda::kBackwardThreads), 0, stream, data,
                               targets.data<I>(), lse.data<float>(), grad_losses.data<float>(), out, rows,
                               vocabulary, ignore_index, cuda::index_error_record());
        WEFT_CUDA_CHECK_LAUNCH();
      });
    });
  });
  cuda::finish_index_checked_launch(stream);
}

void CudaBackend::cross_entropy_with_gradient(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                              const Tensor& grad_losses, const Tensor& losses, const Tensor& lse,
                                              const Tensor& grad_logits) {
  cuda::raise_recorded_index_error();
  const int64_t rows = logits.size(0);
  const int vocabulary = static_cast<int>(logits.size(1));
  if (rows == 0) return;
  if (vocabulary == 0) {
    cross_entropy(logits, targets, ignore_index, losses, lse);
    return;
  }
  const int device = logits.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  // Rows in flight: a few blocks per multiprocessor, so that each row is still in L2 when it is
  // read the second time (132 SMs x 2 rows x 100 KB is 26 MB of the H200's 50 MB).
  constexpr int kRowsPerMultiprocessor = 2;
  const unsigned int grid = static_cast<unsigned int>(
      std::min<int64_t>(rows, static_cast<int64_t>(cuda::multiprocessor_count(device)) * kRowsPerMultiprocessor));
  cuda::dispatch_cuda_index(targets.dtype(), "cross_entropy_with_gradient", [&]<class I>() {
    cuda::dispatch_cuda_floating(logits.dtype(), "cross_entropy_with_gradient", [&]<class T>() {
      const T* data = logits.data<T>();
      T* out = grad_logits.data<T>();
      cuda::dispatch_pack<T>(cuda::can_use_packs<T>(vocabulary, data, out), [&]<int kVec>() {
        // A packed row that fits in shared memory stays there between the two passes; else the
        // second pass reads it from L2.
        const int64_t row_bytes = static_cast<int64_t>(vocabulary) * static_cast<int64_t>(sizeof(T));
        const int threads = cuda::threads_for(vocabulary / kVec, cuda::kBackwardThreads);
        constexpr auto bulk_kernel = cuda::cross_entropy_with_gradient_bulk_kernel<T, I, kVec>;
        // Rows of 4 KB or more (each chunk a copy of some size) that fit twice, on Hopper.
        if (kVec > 1 && row_bytes >= 4096 && row_bytes <= cuda::kBulkRowBytes &&
            cuda::bulk::kernel_runs_bulk_copies<bulk_kernel>(device)) {
          cuda::allow_dynamic_shared_memory<bulk_kernel>(static_cast<size_t>(2 * row_bytes), device);
          const auto bulk_grid = static_cast<unsigned int>(
              std::min<int64_t>(rows, static_cast<int64_t>(cuda::multiprocessor_count(device))));
          cuda::launch_dependent(bulk_kernel, bulk_grid, cuda::kBulkThreads, static_cast<size_t>(2 * row_bytes),
                                 stream, data, targets.data<I>(), grad_losses.data<float>(), losses.data<float>(),
                                 lse.data<float>(), out, rows, vocabulary, ignore_index, cuda::index_error_record());
        } else if (kVec > 1 && row_bytes <= cuda::kResidentRowBytes) {
          constexpr auto kernel = cuda::cross_entropy_with_gradient_kernel<T, I, kVec, true>;
          cuda::allow_dynamic_shared_memory<kernel>(static_cast<size_t>(row_bytes), device);
          cuda::launch_dependent(kernel, cuda::grid_for(rows, 1), threads, static_cast<size_t>(row_bytes), stream,
                                 data, targets.data<I>(), grad_losses.data<float>(), losses.data<float>(),
                                 lse.data<float>(), out, rows, vocabulary, ignore_index, cuda::index_error_record());
        } else {
          cuda::launch_dependent(cuda::cross_entropy_with_gradient_kernel<T, I, kVec, false>, grid, threads, 0, stream,
                                 data, targets.data<I>(), grad_losses.data<float>(), losses.data<float>(),
                                 lse.data<float>(), out, rows, vocabulary, ignore_index, cuda::index_error_record());
        }
        WEFT_CUDA_CHECK_LAUNCH();
      });
    });
  });
  cuda::finish_index_checked_launch(stream);
}

}  // namespace weft
