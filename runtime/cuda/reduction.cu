// CUDA kernels: sum, mean and max over any set of dims of a strided tensor.
//
// x's dims are split into kept dims (the output's rows, in order) and reduced dims; each side gets a
// StridedIndexer over x's strides, so a row's base offset and an element's offset within the row are
// found by index math, never by a permuted copy. Two kernels:
// - rows: one block per output row, threads stride along the reduced elements, then warp shuffles
//   and one shared-memory step. Used when the reduced elements are contiguous (softmax-like rows,
//   the common case) or many.
// - columns: a block covers 32 consecutive outputs and 8 slices of the reduced range, so a warp
//   reads 32 neighbouring elements (reducing over the batch for a bias gradient, say).
// When few outputs cover many elements (a whole-tensor sum, a bias gradient over every token), both
// kernels split the reduced range into slices (blockIdx.y) that write f32 partials, and a second
// kernel sums the partials of each output in slice order (sums and means; max is never split).
// The column-sum kernel (bias gradients: 48 a GPT-2 step, 8-40 us each on an H100) and the partials'
// kernel are launched as programmatic dependents (dependent_launch.cuh), so that their launches hide
// under the kernel before them; the column sums let the partials' kernel start as they finish.
// Accumulation is f32 (the CPU reference uses double; sums agree within the f32 tolerance). Max
// returns the first index of the maximum and propagates NaN (the first NaN wins), like the CPU.
// out and indices are contiguous, with x's shape and the reduced dims set to 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <vector>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/cuda/strided_indexer.cuh"

namespace weft {
namespace cuda {
namespace {

constexpr int64_t kNoIndex = INT64_MAX;  // "saw no element yet": loses every comparison

// A candidate maximum: value and its position along the reduced elements.
struct Best {
  float value;
  int64_t index;
};

// The better of two candidates: any NaN beats a number, the larger value wins, and ties (and two
// NaNs) go to the smaller index. Associative and commutative, so any reduction order gives the
// first maximum, as the CPU's sequential scan does.
__device__ __forceinline__ Best better(const Best& a, const Best& b) {
  if (b.index == kNoIndex) return a;
  if (a.index == kNoIndex) return b;
  const bool a_nan = isnan(a.value), b_nan = isnan(b.value);
  if (a_nan || b_nan) {
    if (a_nan && b_nan) return a.index <= b.index ? a : b;
    return a_nan ? a : b;
  }
  if (a.value > b.value) return a;
  if (b.value > a.value) return b;
  return a.index <= b.index ? a : b;
}

__device__ __forceinline__ Best warp_best(Best best) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other;
    other.value = __shfl_xor_sync(0xffffffffu, best.value, offset);
    other.index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    best = better(best, other);
  }
  return best;
}

// Adds element `index` of the reduced dimension (value) to a running sum, or to the running best
// for kMax.
__device__ __forceinline__ void accumulate(ReduceOp op, float value, int64_t index, float& sum, Best& best) {
  if (op == ReduceOp::kMax) {
    best = better(best, Best{value, index});
  } else {
    sum += value;
  }
}

template <class T>
__device__ __forceinline__ void write_result(ReduceOp op, T* out, int64_t* indices, int64_t row, float sum,
                                             const Best& best, int64_t reduced_count) {
  if (op == ReduceOp::kMax) {
    const bool empty = best.index == kNoIndex;
    out[row] = from_float<T>(empty ? -INFINITY : best.value);
    if (indices != nullptr) indices[row] = empty ? 0 : best.index;
  } else if (op == ReduceOp::kMean && reduced_count > 0) {
    out[row] = from_float<T>(sum / static_cast<float>(reduced_count));
  } else {
    out[row] = from_float<T>(sum);
  }
}

// One block per output row (grid-strided over rows); blockDim.x is a multiple of 32, at most 1024.
template <class T>
__global__ void reduce_rows_kernel(ReduceOp op, const T* x, T* out, int64_t* indices, StridedIndexer<1> kept,
                                   StridedIndexer<1> reduced, int64_t rows, int64_t reduced_count, int64_t chunk,
                                   float* partials) {
  __shared__ float shared_sum[32];
  __shared__ Best shared_best[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t base[1];
    kept.offsets(row, base);
    float sum = 0.0f;
    Best best{-INFINITY, kNoIndex};
    const int64_t r_begin = blockIdx.y * chunk;
    const int64_t r_end = r_begin + chunk < reduced_count ? r_begin + chunk : reduced_count;
    for (int64_t r = r_begin + threadIdx.x; r < r_end; r += blockDim.x) {
      int64_t offset[1];
      reduced.offsets(r, offset);
      accumulate(op, to_float(x[base[0] + offset[0]]), r, sum, best);
    }
    if (op == ReduceOp::kMax) {
      best = warp_best(best);
      if (lane == 0) shared_best[warp] = best;
    } else {
      sum = warp_sum(sum);
      if (lane == 0) shared_sum[warp] = sum;
    }
    __syncthreads();
    if (warp == 0) {
      if (op == ReduceOp::kMax) {
        best = lane < warps ? shared_best[lane] : Best{-INFINITY, kNoIndex};
        best = warp_best(best);
      } else {
        sum = lane < warps ? shared_sum[lane] : 0.0f;
        sum = warp_sum(sum);
      }
      if (lane == 0) {
        if (partials != nullptr) {
          partials[blockIdx.y * rows + row] = sum;
        } else {
          write_result(op, out, indices, row, sum, best, reduced_count);
        }
      }
    }
    __syncthreads();  // the shared slots are reused by the next row
  }
}

constexpr int kColumnOutputs = 32;  // outputs per block (threadIdx.x)
constexpr int kColumnSlices = 8;    // slices of the reduced range per block (threadIdx.y)

template <class T>
__global__ void reduce_columns_kernel(ReduceOp op, const T* x, T* out, int64_t* indices, StridedIndexer<1> kept,
                                      StridedIndexer<1> reduced, int64_t rows, int64_t reduced_count, int64_t chunk,
                                      float* partials) {
  __shared__ float shared_sum[kColumnSlices][kColumnOutputs + 1];
  __shared__ Best shared_best[kColumnSlices][kColumnOutputs + 1];
  for (int64_t first = blockIdx.x * int64_t{kColumnOutputs}; first < rows;
       first += int64_t{gridDim.x} * kColumnOutputs) {
    const int64_t row = first + threadIdx.x;
    float sum = 0.0f;
    Best best{-INFINITY, kNoIndex};
    if (row < rows) {
      int64_t base[1];
      kept.offsets(row, base);
      const int64_t r_begin = blockIdx.y * chunk;
      const int64_t r_end = r_begin + chunk < reduced_count ? r_begin + chunk : reduced_count;
      for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kColumnSlices) {
        int64_t offset[1];
        reduced.offsets(r, offset);
        accumulate(op, to_float(x[base[0] + offset[0]]), r, sum, best);
      }
    }
    shared_sum[threadIdx.y][threadIdx.x] = sum;
    shared_best[threadIdx.y][threadIdx.x] = best;
    __syncthreads();
    if (threadIdx.y == 0 && row < rows) {
      for (int slice = 1; slice < kColumnSlices; ++slice) {
        sum += shared_sum[slice][threadIdx.x];
        best = better(best, shared_best[slice][threadIdx.x]);
      }
      if (partials != nullptr) {
        partials[blockIdx.y * rows + row] = sum;
      } else {
        write_result(op, out, indices, row, sum, best, reduced_count);
      }
    }
    __syncthreads();
  }
}

// Second pass of a split sum or mean: partials [splits, rows] (f32), one block per output row;
// thread t sums slices t, t + blockDim.x, ..., then a fixed shuffle tree: the result does not
// depend on scheduling. blockDim.x is kFinalThreads.
constexpr int kFinalThreads = 128;

template <class T>
__global__ void reduce_partials_kernel(ReduceOp op, const float* partials, int64_t splits, T* out, int64_t rows,
                                       int64_t reduced_count) {
  __shared__ float shared_sum[kFinalThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float sum = 0.0f;
    for (int64_t slice = threadIdx.x; slice < splits; slice += blockDim.x) sum += partials[slice * rows + row];
    sum = warp_sum(sum);
    if (lane == 0) shared_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < kFinalThreads / 32; ++w) total += shared_sum[w];
      write_result(op, out, static_cast<int64_t*>(nullptr), row, total, Best{-INFINITY, kNoIndex}, reduced_count);
    }
    __syncthreads();
  }
}

// Column sums of a [reduced, columns] matrix whose columns are contiguous (row stride a multiple of
// the vector width, start 16-byte aligned): the bias gradient over every token. Each thread loads
// 16 bytes (kPer adjacent columns) per row, so a warp reads 512 contiguous bytes; threadIdx.y
// strides the rows of this block's slice (blockIdx.y), and the 8 row partials of each column are
// summed through shared memory in slice order.
template <class T>
struct alignas(16) Vector16 {
  T value[16 / sizeof(T)];
};

template <class T>
__global__ void column_sums_kernel(ReduceOp op, const T* x, T* out, int64_t columns, int64_t row_stride,
                                   int64_t reduced_count, int64_t chunk, float* partials) {
  constexpr int kPer = 16 / sizeof(T);
  constexpr int kBlockColumns = kColumnOutputs * kPer;
  __shared__ float shared_sum[kColumnSlices][kBlockColumns + 1];
  const int64_t group = blockIdx.x * int64_t{kColumnOutputs} + threadIdx.x;  // in vectors
  const int64_t groups = columns / kPer;
  float sum[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum[j] = 0.0f;
  wait_for_previous_kernels();  // launched as a dependent (launch_dependent): no global access before
  if (group < groups) {
    const int64_t r_begin = blockIdx.y * chunk;
    const int64_t r_end = r_begin + chunk < reduced_count ? r_begin + chunk : reduced_count;
    const Vector16<T>* base = reinterpret_cast<const Vector16<T>*>(x) + group;
    const int64_t vector_stride = row_stride / kPer;
#pragma unroll 4
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kColumnSlices) {
      const Vector16<T> loaded = base[r * vector_stride];
#pragma unroll
      for (int j = 0; j < kPer; ++j) sum[j] += to_float(loaded.value[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) shared_sum[threadIdx.y][threadIdx.x * kPer + j] = sum[j];
  __syncthreads();
  for (int t = threadIdx.y * kColumnOutputs + threadIdx.x; t < kBlockColumns; t += kColumnOutputs * kColumnSlices) {
    const int64_t column = blockIdx.x * int64_t{kBlockColumns} + t;
    if (column >= columns) continue;
    float total = 0.0f;
    for (int slice = 0; slice < kColumnSlices; ++slice) total += shared_sum[slice][t];
    if (partials != nullptr) {
      partials[blockIdx.y * columns + column] = total;
    } else {
      write_result(op, out, static_cast<int64_t*>(nullptr), column, total, Best{-INFINITY, kNoIndex},
                   reduced_count);
    }
  }
  allow_next_kernel_to_start();  // the partials' kernel still waits for every write above
}

}  // namespace
}  // namespace cuda

void CudaBackend::reduce(ReduceOp op, const Tensor& x, absl::Span<const int64_t> dims, const Tensor& out,
                         const Tensor& indices) {
  const int64_t rows = out.numel();
  if (rows == 0) return;
  const int64_t reduced_count = x.numel() / rows;
  const int device = out.device().index;
  cuda::check_device(device);
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);

  // Split x's dims into kept (the output rows, row-major) and reduced (row-major positions).
  std::vector<int64_t> kept_sizes, kept_strides, reduced_sizes, reduced_strides;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool is_reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    (is_reduced ? reduced_sizes : kept_sizes).push_back(x.shape()[d]);
    (is_reduced ? reduced_strides : kept_strides).push_back(x.strides()[d]);
  }
  const auto kept = cuda::make_strided_indexer<1>(kept_sizes, {absl::MakeConstSpan(kept_strides)}, "reduce");
  const auto reduced = cuda::make_strided_indexer<1>(reduced_sizes, {absl::MakeConstSpan(reduced_strides)}, "reduce");
  const bool outputs_adjacent = kept.strides[0][kept.rank - 1] == 1 && kept.sizes[kept.rank - 1] > 1;
  const bool elements_adjacent = reduced.strides[0][reduced.rank - 1] == 1;
  const bool by_columns = (outputs_adjacent && !elements_adjacent) || reduced_count <= 16;
  int64_t* index_data = op == ReduceOp::kMax && indices.defined() ? indices.data<int64_t>() : nullptr;

  // Sums over a contiguous-column matrix (bias gradients): 16-byte loads along the columns.
  const int64_t element_bytes = x.element_size();
  const int64_t per_vector = 16 / element_bytes;
  const bool column_vectors = op != ReduceOp::kMax && by_columns && kept.rank == 1 && kept.strides[0][0] == 1 &&
                              reduced.rank == 1 && x.dtype() != kFloat64 && rows % per_vector == 0 &&
                              reduced.strides[0][0] % per_vector == 0 && reduced.strides[0][0] >= rows &&
                              reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0;

  // Few outputs over many elements (a whole-tensor sum, a bias gradient over every token): one block
  // per output (or per 32 outputs) would leave most of the chip idle, so the reduced range is split
  // into slices reduced by separate blocks into f32 partials, then summed in a second pass.
  // Sums and means only: max keeps its single pass.
  const int64_t target_blocks = 4 * static_cast<int64_t>(cuda::multiprocessor_count(device));
  const int64_t block_columns = column_vectors ? cuda::kColumnOutputs * per_vector : cuda::kColumnOutputs;
  const int64_t row_blocks = by_columns ? (rows + block_columns - 1) / block_columns : rows;
  const int64_t min_chunk = column_vectors ? 64 : by_columns ? 256 : 4096;
  int64_t splits = 1;
  if (op != ReduceOp::kMax && row_blocks < target_blocks / 2 && reduced_count >= 2 * min_chunk) {
    splits = std::min<int64_t>({(target_blocks + row_blocks - 1) / row_blocks, reduced_count / min_chunk, 65535});
  }
  int64_t chunk = (reduced_count + splits - 1) / splits;
  if (splits > 1) splits = (reduced_count + chunk - 1) / chunk;  // no empty slice
  Tensor partials;
  float* partial_data = nullptr;
  if (splits > 1) {
    partials = Tensor::empty({splits * rows}, kFloat32, out.device());
    partial_data = partials.data<float>();
  } else {
    chunk = reduced_count;
  }

  cuda::dispatch_cuda_floating(x.dtype(), "reduce", [&]<class T>() {
    const T* in = x.data<T>();
    T* data = out.data<T>();
    if (column_vectors) {
      const int64_t blocks = std::min<int64_t>(row_blocks, 65535LL * 32);
      const dim3 threads(cuda::kColumnOutputs, cuda::kColumnSlices);
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
      cuda::launch_dependent(cuda::column_sums_kernel<T>, grid, threads, 0, stream, op, in, data, rows,
                             reduced.strides[0][0], reduced_count, chunk, partial_data);
    } else if (by_columns) {
      const int64_t blocks = std::min<int64_t>((rows + cuda::kColumnOutputs - 1) / cuda::kColumnOutputs, 65535LL * 32);
      const dim3 threads(cuda::kColumnOutputs, cuda::kColumnSlices);
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
      cuda::reduce_columns_kernel<T><<<grid, threads, 0, stream>>>(op, in, data, index_data, kept, reduced, rows,
                                                                   reduced_count, chunk, partial_data);
    } else {
      int threads = 32;
      while (threads < 512 && threads < chunk) threads *= 2;
      const int64_t blocks = std::min<int64_t>(rows, 65535LL * 32);
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
      cuda::reduce_rows_kernel<T><<<grid, threads, 0, stream>>>(op, in, data, index_data, kept, reduced, rows,
                                                                reduced_count, chunk, partial_data);
    }
    WEFT_CUDA_CHECK_LAUNCH();
    if (splits > 1) {
      const int64_t blocks = std::min<int64_t>(rows, 65535LL * 32);
      cuda::launch_dependent(cuda::reduce_partials_kernel<T>, dim3(static_cast<unsigned>(blocks)),
                             dim3(cuda::kFinalThreads), 0, stream, op, static_cast<const float*>(partial_data),
                             splits, data, rows, reduced_count);
      WEFT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace weft
