// Differentiable dropout with a counter-based mask.
//
// Element i of x is zeroed when Philox uniform(seed, offset + i) < p and otherwise scaled by
// 1/(1-p). The mask is never stored: the backward regenerates it from (seed, offset), and every
// backend draws the same mask. With training false, or p == 0, x is returned unchanged.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace weft {

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training = true);

}  // namespace weft
