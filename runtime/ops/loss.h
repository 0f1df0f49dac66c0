// Differentiable cross-entropy loss.
//
// cross_entropy(logits [N, V], targets [N] (i32 or i64), ignore_index) -> scalar: the mean over the
// rows whose target is not ignore_index of -log softmax(logits)[target] (0 when every row is
// ignored). Matches torch.nn.functional.cross_entropy with reduction='mean'.
#pragma once

#include "runtime/tensor.h"

namespace weft {

//
// counted_rows: the number of targets that are not ignore_index, when the caller knows it (a
// training step counts them on the host before uploading the batch); -1 reads the targets back to
// count them, one host synchronization on a device. A wrong count scales the loss wrongly.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     int64_t counted_rows = -1);

}  // namespace weft
