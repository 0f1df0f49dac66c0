// Differentiable reductions: sum, mean and max over dims.
//
// `dims` may be negative and in any order; an empty `dims` reduces over every dim. With keepdim the
// reduced dims stay as size 1, otherwise they are removed. max over one dim also gives the index
// of the maximum (the first one on ties); its gradient flows to that element only.
#pragma once

#include <utility>

#include "absl/types/span.h"
#include "runtime/tensor.h"

namespace weft {

Tensor sum(const Tensor& x, absl::Span<const int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, absl::Span<const int64_t> dims = {}, bool keepdim = false);
// (values, indices (i64)) of the maximum along `dim`.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (the inverse of expand). Not differentiable; used by
// the backward of broadcasting ops.
Tensor sum_to_shape(const Tensor& x, absl::Span<const int64_t> shape);

}  // namespace weft
