// Sharding: a parameter's full tensor and the shard each tensor-parallel rank holds of it.
//
// What the model's initial weights, checkpoints and resharding on load go through: a run at
// tp = N builds the one-process weights and keeps shard_of(full, layout, rank, N) of each, so it
// starts from exactly the one-process model; a checkpoint stores the full tensors (gather_full),
// so a run saved at one tp resumes at any other.
//
//   Replicate            every rank holds `full`
//   Split(d)             rank r holds elements [r n / N, (r + 1) n / N) of dim d (n = full.size(d))
//   Split(d, blocks)     the same within each block of dim d, the rank's pieces concatenated in
//                        block order (a fused q/k/v weight: rank r holds q, k and v rows of its heads)
//   Partial              not a layout of a stored tensor: refused
//
// Invariants: assemble_shards(shard_of(full, layout, r, N) for r in 0..N-1, layout) == full, bit
// for bit; shard_of returns a contiguous copy (a shard is trained on its own storage).
#pragma once

#include <vector>

#include "parallel/tensor/tensor_parallel_group.h"
#include "runtime/layout.h"
#include "runtime/tensor.h"

namespace weft {

// Throws weft::Error unless `shape` can be split by `layout` over `size` ranks (every block of the
// split dim divisible by `size`, blocks adding up to the dim); `what` names the tensor in the message.
void check_shardable(const Shape& shape, const Layout& layout, int size, const std::string& what);
// The shape of one shard of a tensor of `full_shape`.
Shape shard_shape(const Shape& full_shape, const Layout& layout, int size);
// Rank `rank`'s shard of `full` (contiguous, same dtype and device).
Tensor shard_of(const Tensor& full, const Layout& layout, int rank, int size);
// The full tensor from every rank's shard, in rank order.
Tensor assemble_shards(const std::vector<Tensor>& shards, const Layout& layout);
// The full tensor from this rank's shard, on every rank of tp (an all-gather when split). Collective.
Tensor gather_full(const Tensor& shard, const Layout& layout, const TensorParallelGroup& tp);

}  // namespace weft
