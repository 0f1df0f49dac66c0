// Shapes and strides.
//
// A shape lists the size of each dimension, outermost first; strides count elements (not bytes).
// A contiguous tensor has row-major strides. A stride of 0 repeats one element along a dimension
// (that is how expand broadcasts without copying).
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace weft {

using Shape = absl::InlinedVector<int64_t, 6>;
using Strides = absl::InlinedVector<int64_t, 6>;

// Product of the sizes (1 for a scalar shape {}).
int64_t shape_numel(absl::Span<const int64_t> shape);
// Row-major strides for a shape.
Strides contiguous_strides(absl::Span<const int64_t> shape);
// "[2, 3, 4]".
std::string shape_string(absl::Span<const int64_t> shape);
// Maps a possibly negative dim into [0, rank); throws naming `op` and the shape when out of range.
int64_t normalize_dim(int64_t dim, absl::Span<const int64_t> shape, std::string_view op);
// The same for a rank alone (where a new dim is being inserted, as unsqueeze does).
int64_t normalize_dim(int64_t dim, int64_t rank, std::string_view op);
// The broadcast of two shapes (numpy rules); throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(absl::Span<const int64_t> a, absl::Span<const int64_t> b, std::string_view op);

}  // namespace weft
