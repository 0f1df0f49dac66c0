// The gradient norm's squares over a tensor-parallel group, chosen exactly.
//
// Under tensor parallelism each rank computes the squared norms of its own parameters' gradients:
// a split parameter's are of this rank's shard (the whole parameter's is their sum over tp), a
// replicated parameter's are the whole parameter's already, the same on every rank (counted once).
// Every rank must end with the same bits: the clipping factor comes from their total, and each rank
// applies it to its own copy of every replicated parameter, so a factor that differs in its last bit
// between ranks makes those copies drift apart a little more each step (and a checkpoint, which keeps
// one copy, resumes a different model on the others).
//
// Hence a choice, not arithmetic: local + (summed - local) * split rounds (summed - local) on each
// rank differently once tp has more than two ranks (about 1% of f32 and f64 values at tp 4 are off
// by an ulp), while summed * split + local * (1 - split) multiplies by 0 and 1 only, which is exact.
#pragma once

#include "runtime/tensor.h"

namespace weft {

// local [n]: this rank's squared norms; summed [n]: `local` summed over the tp group (identical on
// every rank); split [n]: 1 where the parameter is split over tp, 0 where replicated. All of one
// dtype and device. Returns [n]: `summed` where split, `local` where replicated, bit for bit.
Tensor squares_over_tensor_parallel_group(const Tensor& local, const Tensor& summed, const Tensor& split);

}  // namespace weft
