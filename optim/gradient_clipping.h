// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ (L2) does it.
//
// The norm is taken over all gradients together, as if they were one vector: the squares are
// summed in f64 on the CPU (whatever the gradients' dtype) and in f32 trees on devices, which have
// no f64 kernels; one host synchronisation per call. When it exceeds max_norm every gradient is scaled by max_norm / (norm + 1e-6), keeping the
// update's direction. A non-finite norm (an overflow or a NaN loss) is returned without touching
// the gradients, so the caller can see it and skip the step.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace weft {

// Returns the global L2 norm of the .grad of `parameters` before clipping (parameters without a
// gradient count as zero). max_norm <= 0 disables clipping: only the norm is computed.
double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm);

}  // namespace weft
