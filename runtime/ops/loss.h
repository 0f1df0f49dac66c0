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

// cross_entropy for a training step, whose gradient is computed in the forward pass and written
// over the logits (llm.c's fused classifier): one pass over [N, V] fewer than forward then
// backward. The logits' values are gone after the call, so pass logits that nothing else reads
// (the output head's, as the step builder does). expected_gradient is the seed the backward is
// expected to bring to this loss (1, or 1 / micro-batches under a later scale); a different seed
// still gives the right gradient, at the cost of one more pass (Backend::rescale_unless_expected,
// decided on the device). counted_rows as for cross_entropy, required here (>= 0). The result is
// cross_entropy's value and, for the expected seed, its gradient: bitwise on the CPU, to the last
// bit of f32 on CUDA (one kernel instead of two).
Tensor cross_entropy_overwriting_logits(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                        int64_t counted_rows, double expected_gradient);

}  // namespace weft
