// Differentiable cross-entropy loss.
//
// cross_entropy(logits [N, V], targets [N] (i32 or i64), ignore_index) -> scalar: the mean over the
// rows whose target is not ignore_index of -log softmax(logits)[target] (0 when every row is
// ignored). Matches torch.nn.functional.cross_entropy with reduction='mean'.
#pragma once

#include "runtime/tensor.h"

namespace weft {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace weft
