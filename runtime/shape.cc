#include "runtime/shape.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "runtime/error.h"

namespace weft {

int64_t shape_numel(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return count;
}

Strides contiguous_strides(absl::Span<const int64_t> shape) {
  Strides strides(shape.size());
  int64_t step = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = step;
    step *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_string(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t normalize_dim(int64_t dim, int64_t rank, std::string_view op) {
  const int64_t normalized = dim < 0 ? dim + rank : dim;
  WEFT_CHECK(normalized >= 0 && normalized < rank, op, ": dim ", dim,
             " is out of range for a tensor of rank ", rank, " (valid: ", -rank, " to ", rank - 1, ")");
  return normalized;
}

int64_t normalize_dim(int64_t dim, absl::Span<const int64_t> shape, std::string_view op) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t normalized = dim < 0 ? dim + rank : dim;
  WEFT_CHECK(normalized >= 0 && normalized < rank, op, ": dim ", dim, " is out of range for a tensor of rank ", rank,
             " and shape ", shape_string(shape), " (valid: ", -rank, " to ", rank - 1, ")");
  return normalized;
}

Shape broadcast_shapes(absl::Span<const int64_t> a, absl::Span<const int64_t> b, std::string_view op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t size_a = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t size_b = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    WEFT_CHECK(size_a == size_b || size_a == 1 || size_b == 1, op, ": shapes ", shape_string(a), " and ",
               shape_string(b), " cannot be broadcast together (dim ", i, ": ", size_a, " vs ", size_b, ")");
    out[i] = size_a == 1 ? size_b : size_a;
  }
  return out;
}

}  // namespace weft
