// Layout transitions: an activation laid out one way over the tensor-parallel group, laid out
// another way, with the collective that takes (the auto comm mode's building block).
//
//   from -> to           what runs                          shape of this rank's tensor
//   partial -> replicate all_reduce(sum)                    [..., n, ...] -> [..., n, ...]
//   partial -> split(d)  reduce_scatter(sum) along d        [..., n, ...] -> [..., n / t, ...]
//   split(d) -> replicate all_gather along d                [..., m, ...] -> [..., t m, ...]
//   replicate -> split(d) nothing: this rank's slice        [..., n, ...] -> [..., n / t, ...]
//   X -> X               nothing: x itself
//
// (t = tp.size().) Rank r's slice along d is elements [r n / t, (r + 1) n / t). The collectives
// work on flat element ranges (group rank r owns [r k, (r + 1) k)), so a split along a dim that is
// not the leading one (the sequence dim 1 of [B, T, C]) is moved to the front first
// ([B, T, C] -> [B, t, T / t, C] -> [t, B, T / t, C], contiguous) and back after a gather.
//
// redistribute is the differentiable form: its backward changes the gradient from the layout it
// arrives in to the gradient layout of `from` (gradient_layout_of). Megatron's tensor-parallel
// mappings are instances:
//   copy to tp region (forward identity, backward all-reduce)   redistribute(x, R, R, P)
//   reduce from tp region (row-parallel output)                 redistribute(x, P, R)
//   gather from tp region (backward split)                      redistribute(x, S(-1), R)
//   scatter to sequence-parallel region (backward all-gather)   redistribute(x, R, S(1))
//   gather from sequence-parallel region into a column-parallel redistribute(x, S(1), R, P)
//     matmul (backward reduce-scatter)
//   reduce-scatter to sequence-parallel region                  redistribute(x, P, S(1))
//
// Invariants: the result has x's dtype and device and is contiguous unless it is x itself; x is
// never written (an all-reduce works on a copy); with tp.size() == 1 every transition returns x
// (layouts are still checked: a wrong plan fails on one process too); a Split with blocks (a fused
// weight's layout) is refused: activations are split evenly. Every rank of tp must make the same
// calls in the same order (the collectives match by order), backward included: a backward that
// receives no gradient still communicates (zeros).
//
// Streams: collectives run on tp.stream and are waited for at once (CommStream's wait: the CPU
// blocks, CUDA orders the caller's current stream after them without blocking the host). On a CUDA
// tp.stream other than the caller's current stream, the comm stream is first ordered after the
// current stream with an event, so the collective reads x only once the kernels that produced it
// (and the transposing copy made here) have run.
#pragma once

#include "parallel/tensor/tensor_parallel_group.h"
#include "runtime/layout.h"
#include "runtime/tensor.h"

namespace weft {

// No autograd. Returns `x` (laid out as `from` over tp) laid out as `to`. Collectives run on
// tp.stream and are waited for at once. Throws weft::Error naming both layouts for a transition not
// in the table above, and naming the shape and tp size when a split dim is not divisible by it.
Tensor change_layout(const Tensor& x, const Layout& from, const Layout& to, const TensorParallelGroup& tp);

// The layout a gradient of a tensor laid out as `layout` has: Replicate for Replicate and Partial
// (every rank's partial sum feeds the total, so each gets the whole gradient), Split(d) for Split(d).
Layout gradient_layout_of(const Layout& layout);

// Differentiable: forward change_layout(x, from, to); backward change_layout(grad,
// gradient_arrives_as, gradient_layout_of(from)). `gradient_arrives_as` is the layout the gradient
// of the output has when it reaches this op: a Replicate tensor entering a column-parallel matmul
// gets a Partial gradient (each rank's matmul backward sees only its columns), so the backward
// all-reduces; an all-gather feeding a column-parallel matmul gets a Partial gradient, so the
// backward reduce-scatters. It must describe a tensor of the output's local shape: Replicate or
// Partial when `to` is, the same Split when `to` is a Split. Returns x itself (no node) when both
// directions are identities, and always at tp.size() == 1.
Tensor redistribute(const Tensor& x, const Layout& from, const Layout& to, const Layout& gradient_arrives_as,
                    const TensorParallelGroup& tp);
// gradient_arrives_as = gradient_layout_of(to).
Tensor redistribute(const Tensor& x, const Layout& from, const Layout& to, const TensorParallelGroup& tp);

}  // namespace weft
