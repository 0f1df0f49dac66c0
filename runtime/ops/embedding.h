// Differentiable embedding lookup: ids [...] (i32 or i64) into weight [V, C] gives [..., C]. The
// gradient scatter-adds into weight (rows of repeated ids accumulate). An id outside [0, V) is an
// error naming the id and V.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor embedding(const Tensor& ids, const Tensor& weight);

}  // namespace weft
