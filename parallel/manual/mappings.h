// The manual comm mode's tensor- and sequence-parallel region functions (Megatron-LM's mappings.py):
// autograd functions whose forward and backward call the tp group's collectives themselves, on
// tp.stream, each waited for at once.
//
//   copy_to_tensor_parallel_region              forward identity          backward all-reduce
//   reduce_from_tensor_parallel_region          forward all-reduce        backward identity
//   gather_from_sequence_parallel_region        forward all-gather dim 1  backward reduce-scatter dim 1
//   reduce_scatter_to_sequence_parallel_region  forward reduce-scatter 1  backward all-gather dim 1
//   scatter_to_sequence_parallel_region         forward this rank's chunk backward all-gather dim 1
//
// Activations are [B, T, ...]; the sequence dim is 1 and rank r holds positions [r T/N, (r + 1) T/N).
// ProcessGroup's collectives work on flat ranges with rank r owning the r-th, so the sequence dim is
// moved to the front (a copy) around them. With tp size 1 every function returns its input, no copy.
// Every rank of the group must call the same functions in the same order, forward and backward.
#pragma once

#include "parallel/tensor/tensor_parallel_group.h"
#include "runtime/tensor.h"

namespace weft {

// x (replicated) -> x; the gradient, a partial sum per rank, is all-reduced.
Tensor copy_to_tensor_parallel_region(const Tensor& x, const TensorParallelGroup& tp);
// x (Partial) -> the sum over tp (replicated); the gradient passes through.
Tensor reduce_from_tensor_parallel_region(const Tensor& x, const TensorParallelGroup& tp);
// x [B, T/N, ...] -> [B, T, ...]; the gradient [B, T, ...] (Partial) is reduce-scattered back.
Tensor gather_from_sequence_parallel_region(const Tensor& x, const TensorParallelGroup& tp);
// x [B, T, ...] (Partial) -> [B, T/N, ...], this rank's chunk of the sum; the gradient is all-gathered.
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, const TensorParallelGroup& tp);
// x [B, T, ...] (replicated) -> [B, T/N, ...], this rank's chunk; the gradient is all-gathered.
Tensor scatter_to_sequence_parallel_region(const Tensor& x, const TensorParallelGroup& tp);

}  // namespace weft
