// Building blocks shared by the CPU kernels: dtype dispatch and strided iteration.
//
// dispatch_floating(dtype, "op", [&]<class T>() { ... }) instantiates the body for the stored
// element type T of a floating dtype (float, BFloat16, Float16, double); ComputeType<T> is the type
// to compute in. for_each_index walks every element of a shape in row-major order and hands the
// body each operand's element offset, so kernels accept any view (transposed, sliced, broadcast).
// for_each_row does the same a row at a time, after merging the dims that every operand lays out
// contiguously (a contiguous tensor is one row), and splits the rows (or one long row) over the
// thread pool: the elementwise kernels' inner loops then run over unit or zero strides, which the
// compiler vectorizes.
#pragma once

#include <array>
#include <cstdint>

#include "runtime/cpu/parallel_for.h"

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/shape.h"
#include "runtime/tensor.h"

namespace weft::cpu {

template <class Body>
void dispatch_floating(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case kFloat32: body.template operator()<float>(); return;
    case kBFloat16: body.template operator()<BFloat16>(); return;
    case kFloat16: body.template operator()<Float16>(); return;
    case kFloat64: body.template operator()<double>(); return;
    default: WEFT_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported (expected f32, bf16, f16 or f64)");
  }
}

template <class Body>
void dispatch_all(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case kInt32: body.template operator()<int32_t>(); return;
    case kInt64: body.template operator()<int64_t>(); return;
    case kInt16: body.template operator()<int16_t>(); return;
    default: dispatch_floating(dtype, op, std::forward<Body>(body));
  }
}

template <class Body>
void dispatch_index(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case kInt32: body.template operator()<int32_t>(); return;
    case kInt64: body.template operator()<int64_t>(); return;
    default: WEFT_FAIL(op, ": index dtype ", dtype_name(dtype), " is not supported (expected i32 or i64)");
  }
}

// Calls body(offset_0, ..., offset_{N-1}) for every element of `shape`, in row-major order, where
// offset_k is the element offset of that element in operand k (strides given per operand).
template <size_t N, class Body>
void for_each_index(absl::Span<const int64_t> shape, const std::array<const Strides*, N>& strides, Body&& body) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return;
  std::array<int64_t, N> offsets{};
  if (rank == 0) {
    std::apply(body, offsets);
    return;
  }
  const int64_t inner = shape[rank - 1];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = (*strides[k])[rank - 1];
  absl::InlinedVector<int64_t, 6> index(static_cast<size_t>(rank), 0);
  for (int64_t done = 0; done < numel; done += inner) {
    std::array<int64_t, N> row = offsets;
    for (int64_t i = 0; i < inner; ++i) {
      std::apply(body, row);
      for (size_t k = 0; k < N; ++k) row[k] += inner_strides[k];
    }
    // Advance the outer index (all dims but the last) like an odometer.
    for (int64_t d = rank - 2; d >= 0; --d) {
      ++index[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += (*strides[k])[d];
      if (index[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= (*strides[k])[d] * shape[d];
      index[d] = 0;
    }
  }
}

// Calls body(offsets, inner_strides, length) for every row of `shape` after merging the dims that all
// N operands lay out contiguously (dims of size 1 dropped), where offsets[k] is operand k's element
// offset of the row's first element and inner_strides[k] its stride along the row. Rows, or chunks
// of a single long row, go to the thread pool (parallel_for.h) when there are enough elements
// (work_per_element: rough operations per element); each element is visited exactly once, so the
// body may write its output element by element, but must not accumulate across rows.
template <size_t N, class Body>
void for_each_row(absl::Span<const int64_t> shape, const std::array<const Strides*, N>& strides,
                  int64_t work_per_element, Body&& body) {
  if (shape_numel(shape) == 0) return;
  // Merged dims, outermost first.
  absl::InlinedVector<int64_t, 6> sizes;
  absl::InlinedVector<std::array<int64_t, N>, 6> merged_strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> dim_strides;
    for (size_t k = 0; k < N; ++k) dim_strides[k] = (*strides[k])[d];
    if (!sizes.empty()) {
      bool contiguous = true;
      for (size_t k = 0; k < N; ++k) contiguous &= merged_strides.back()[k] == dim_strides[k] * shape[d];
      if (contiguous) {
        sizes.back() *= shape[d];
        merged_strides.back() = dim_strides;
        continue;
      }
    }
    sizes.push_back(shape[d]);
    merged_strides.push_back(dim_strides);
  }
  std::array<int64_t, N> inner_strides{};
  int64_t inner = 1;
  if (!sizes.empty()) {
    inner = sizes.back();
    inner_strides = merged_strides.back();
    sizes.pop_back();
    merged_strides.pop_back();
  }
  int64_t rows = 1;
  for (int64_t size : sizes) rows *= size;
  if (rows == 1) {
    // One row: split it into chunks.
    parallel_for(inner, work_per_element, [&](int64_t begin, int64_t end) {
      std::array<int64_t, N> offsets;
      for (size_t k = 0; k < N; ++k) offsets[k] = begin * inner_strides[k];
      body(offsets, inner_strides, end - begin);
    });
    return;
  }
  parallel_for(rows, inner * work_per_element, [&](int64_t begin, int64_t end) {
    // The first row's index over the outer dims, then an odometer.
    const int64_t outer = static_cast<int64_t>(sizes.size());
    absl::InlinedVector<int64_t, 6> index(sizes.size(), 0);
    std::array<int64_t, N> offsets{};
    for (int64_t d = outer - 1, rest = begin; d >= 0; --d) {
      index[d] = rest % sizes[d];
      rest /= sizes[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += index[d] * merged_strides[d][k];
    }
    for (int64_t row = begin; row < end; ++row) {
      body(offsets, inner_strides, inner);
      for (int64_t d = outer - 1; d >= 0; --d) {
        ++index[d];
        for (size_t k = 0; k < N; ++k) offsets[k] += merged_strides[d][k];
        if (index[d] < sizes[d]) break;
        for (size_t k = 0; k < N; ++k) offsets[k] -= merged_strides[d][k] * sizes[d];
        index[d] = 0;
      }
    }
  });
}

}  // namespace weft::cpu
