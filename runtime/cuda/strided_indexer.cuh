// Strided element addressing for CUDA kernels that accept any view (transposed, sliced, broadcast).
//
// StridedIndexer<N> maps a row-major linear element index of a shape to the element offsets of N
// operands that share the shape but have their own strides. It is built on the host, with the shape
// simplified first (size-1 dims dropped, dims that are contiguous in every operand merged), and
// passed to kernels by value: up to kMaxKernelDims dims remain after merging, which covers every
// view weft makes. A plain contiguous tensor becomes one dim of stride 1, so its offsets cost one
// multiply.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "absl/types/span.h"
#include "runtime/error.h"
#include "runtime/shape.h"

namespace weft::cuda {

inline constexpr int kMaxKernelDims = 8;

template <int N>
struct StridedIndexer {
  int rank = 0;
  int64_t sizes[kMaxKernelDims] = {};
  int64_t strides[N][kMaxKernelDims] = {};

  // Offsets (in elements) of row-major element `linear` in each operand.
  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&out)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t size = sizes[d];
      const int64_t index = rank == 1 ? linear : linear % size;
      linear = rank == 1 ? 0 : linear / size;
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] += index * strides[k][d];
    }
  }
};

// Builds the indexer for `shape` and the operands' strides (same rank as the shape); `op` names the
// caller in the error raised when more than kMaxKernelDims dims remain.
template <int N>
StridedIndexer<N> make_strided_indexer(absl::Span<const int64_t> shape,
                                       const std::array<absl::Span<const int64_t>, N>& strides,
                                       std::string_view op) {
  // Collect non-trivial dims, outermost first.
  int64_t sizes[64];
  int64_t merged[N][64];
  int rank = 0;
  const int full_rank = static_cast<int>(shape.size());
  WEFT_CHECK(full_rank <= 64, op, ": rank ", full_rank, " is too large for the CUDA backend");
  for (int d = 0; d < full_rank; ++d) {
    if (shape[d] == 1) continue;
    if (rank > 0) {
      // Merge with the previous kept dim when that is exactly one step of this dim in every operand.
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable = mergeable && merged[k][rank - 1] == strides[k][d] * shape[d];
      if (mergeable) {
        sizes[rank - 1] *= shape[d];
        for (int k = 0; k < N; ++k) merged[k][rank - 1] = strides[k][d];
        continue;
      }
    }
    sizes[rank] = shape[d];
    for (int k = 0; k < N; ++k) merged[k][rank] = strides[k][d];
    ++rank;
  }
  WEFT_CHECK(rank <= kMaxKernelDims, op, ": the CUDA kernels take views of at most ", kMaxKernelDims,
             " non-mergeable dims; shape ", shape_string(shape), " has ", rank);
  StridedIndexer<N> indexer;
  indexer.rank = rank;
  for (int d = 0; d < rank; ++d) {
    indexer.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) indexer.strides[k][d] = merged[k][d];
  }
  if (rank == 0) {  // a single element: one dim of size 1
    indexer.rank = 1;
    indexer.sizes[0] = 1;
    for (int k = 0; k < N; ++k) indexer.strides[k][0] = 0;
  }
  return indexer;
}

}  // namespace weft::cuda
