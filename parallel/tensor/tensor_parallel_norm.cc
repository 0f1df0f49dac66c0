// squares_over_tensor_parallel_group (tensor_parallel_norm.h).
#include "parallel/tensor/tensor_parallel_norm.h"

#include "runtime/error.h"
#include "runtime/ops/elementwise.h"

namespace weft {

Tensor squares_over_tensor_parallel_group(const Tensor& local, const Tensor& summed, const Tensor& split) {
  WEFT_CHECK(local.shape() == summed.shape() && local.shape() == split.shape() && local.dim() == 1,
             "squares_over_tensor_parallel_group: local, summed and split must be [n] of one shape; got ",
             local.describe(), ", ", summed.describe(), ", ", split.describe());
  // 1 - split is exact for 0 and 1, and so are the products and the sum with a zero.
  const Tensor replicated = add_scalar(neg(split), 1.0);
  return add(mul(summed, split), mul(local, replicated));
}

}  // namespace weft
