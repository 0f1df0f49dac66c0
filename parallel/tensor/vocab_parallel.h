// Vocabulary-parallel embedding lookup and cross-entropy (Megatron's VocabParallelEmbedding and
// vocab_parallel_cross_entropy), shared by both comm modes.
//
// Rank r of a tp group of size N holds rows [r V/N, (r + 1) V/N) of the token embedding [V, C]
// (Split(0)) and, for the output head, the same columns of the logits [..., V] (Split(-1)). Neither
// the full table nor the full logits are ever assembled:
//
//   vocab_parallel_embedding_partial(ids [...], weight_shard [V/N, C], vocab_start) -> [..., C]
//     Partial: rows of ids in this shard are looked up, the others are zero; the sum over the group
//     (an all-reduce, or a reduce-scatter under sequence parallelism) is the full lookup. Its
//     gradient reaches the shard rows of the ids this rank holds. No communication.
//   vocab_parallel_cross_entropy(logits_shard [N, V/N], targets [N] (global ids), ignore_index,
//                                counted_targets, tp) -> scalar, the same on every rank
//     runtime/ops/loss.h's cross_entropy over the full logits: three all-reduces of [N] (row max,
//     sum of exponentials, target logit) on tp.stream, each waited for at once; the backward,
//     (softmax_shard - onehot_shard) * grad / counted, is local. counted_targets and ignore_index
//     mean what cross_entropy's counted_rows and ignore_index mean; bf16/f16 logits are computed in
//     f32 (f64 for f64), like its kernels.
//
// Invariants: ids and targets are compared as floats of the statistic dtype (exact below 2^24, so
// the vocabulary is at most 2^24); an id or target outside [0, V) that is not ignore_index is not
// detected here (the lookup gives zeros, the target logit is 0). Every op is a composition of
// Backend kernels, so it runs on any device without a host read (except counting the targets when
// counted_targets is -1, as cross_entropy does).
#pragma once

#include <cstdint>

#include "parallel/tensor/tensor_parallel_group.h"
#include "runtime/tensor.h"

namespace weft {

// ids [...] (i32 or i64), weight_shard [V/N, C] (rows vocab_start ..) -> [..., C], Partial over tp.
Tensor vocab_parallel_embedding_partial(const Tensor& ids, const Tensor& weight_shard, int64_t vocab_start);

// logits_shard [N, V/tp] (this rank's vocabulary columns), targets [N] global ids -> scalar mean loss.
Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& targets, int64_t ignore_index,
                                    int64_t counted_targets, const TensorParallelGroup& tp);

}  // namespace weft
