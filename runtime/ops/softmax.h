// Differentiable softmax and log-softmax along one dim (the last by default), computed with the
// row maximum subtracted so large logits do not overflow.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

}  // namespace weft
