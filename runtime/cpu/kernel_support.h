// Building blocks shared by the CPU kernels: dtype dispatch and strided iteration.
//
// dispatch_floating(dtype, "op", [&]<class T>() { ... }) instantiates the body for the stored
// element type T of a floating dtype (float, BFloat16, Float16, double); ComputeType<T> is the type
// to compute in. for_each_index walks every element of a shape in row-major order and hands the
// body each operand's element offset, so kernels accept any view (transposed, sliced, broadcast).
#pragma once

#include <array>
#include <cstdint>

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

}  // namespace weft::cpu
