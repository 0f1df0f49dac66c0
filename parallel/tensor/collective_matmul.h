// Collective matmuls: the auto comm mode's tensor-parallel linears, whose collective is cut into
// ring steps on tp.stream so that each step's transfer runs under a chunk's matmul.
//
// Layouts over the tp axis (P = tp.size(), r = tp.rank(), T = sequence length, dim 1):
//
//   op                       x                      weight            bias             y
//   all_gather_linear        Split(1) [B, T/P, In]  Split(0) [Nl, In] Split(0) [Nl]    Split(2) [B, T, Nl]
//   linear_reduce_scatter    Split(2) [B, T, Inl]   Split(1) [N, Inl] Replicate [N]    Split(1) [B, T/P, N]
//   column_parallel_linear   Replicate [..., In]    Split(0) [Nl, In] Split(0) [Nl]    Split(-1) [..., Nl]
//   row_parallel_linear      Split(-1) [..., Inl]   Split(1) [N, Inl] Replicate [N]    Replicate [..., N]
//
// The first two are sequence parallelism's entry and exit of a tensor-parallel block (Megatron's
// sequence-parallel all-gather / reduce-scatter, fused with the matmul next to them as in
// "collective matmul" / async tensor parallelism); the last two are the same block without
// sequence parallelism. Gradients of the split inputs arrive in their layouts; the gradient of a
// replicated input is replicated (column_parallel_linear all-reduces it), except
// linear_reduce_scatter's bias gradient, which is Partial: the sum of this rank's rows of grad_y
// (the caller sums it over tp, as for any replicated parameter that meets a sequence split).
//
// Pipelining (P - 1 exchange steps on tp.stream per ring, each waited for before the next):
// - ring all-gather (all_gather_linear forward, linear_reduce_scatter backward): at step k the
//   chunk in hand, group rank (r - k) mod P's, is sent to r + 1 while r - 1's arrives, and the
//   chunk in hand's matmul runs meanwhile; its rows are written to their place in the output.
// - ring reduce-scatter (linear_reduce_scatter forward, all_gather_linear backward): at step k the
//   product of the rows destined for rank (r - k - 2) mod P is computed while the partial sum for
//   (r - k - 1) mod P moves to r + 1; the partial received from r - 1 is then added to it and sent
//   on. After P - 1 steps the partial in hand is rank r's chunk of the sum.
// - column_parallel_linear's backward starts the grad_x all-reduce before the grad_weight matmul
//   and waits for it after. row_parallel_linear waits for its all-reduce at once (nothing to hide
//   it under).
//
// Invariants:
// - With P == 1 each op is exactly linear(x, weight, bias): the same autograd op, the same bits,
//   no collective, no copy.
// - Every rank of tp calls the same ops in the same order with the same shapes (the exchanges
//   match by order). T must be divisible by P (linear_reduce_scatter; all_gather_linear's T is
//   P times its shard's); x, weight, bias share one dtype (f32, f64 or bf16 for the CPU group)
//   and the group's device. Products accumulate as linear's do (Backend::matmul: f32 for bf16);
//   a 16-bit partial sum is rounded once per ring step, as NCCL's ring rounds it.
// - Temporaries: the gathered input [B, T, In] (all_gather_linear keeps it for grad_weight; the
//   backward of linear_reduce_scatter gathers grad_y likewise), two or three chunk buffers per
//   ring. With B == 1 a chunk's rows are contiguous, so chunks are received into and products
//   written into their rows in place; with B > 1 (Backend::matmul writes contiguous outputs only)
//   each goes through one reused chunk buffer and a copy.
// - CUDA: collectives run on tp.stream; before each one is queued, tp.stream is made to wait for
//   an event recorded on the calling thread's current stream (the compute), so a transfer starts
//   after the kernels that wrote what it sends and that last read the buffer it receives into;
//   waiting for a handle makes the compute stream wait for the transfer. With the caller stream
//   everything runs in order on the current stream.
#pragma once

#include "parallel/tensor/tensor_parallel_group.h"
#include "runtime/tensor.h"

namespace weft {

// Sequence-parallel entry of a column-parallel linear: x_shard [B, T/P, In] is all-gathered along
// dim 1 and multiplied: y [B, T, Nl] = gather(x) W^T + b, weight [Nl, In], bias [Nl] or undefined.
// Backward: grad_x [B, T/P, In] = reduce-scatter along dim 1 of grad_y W; grad_weight = grad_y^T
// gather(x) (the gathered x kept from forward); grad_bias = grad_y summed over B and T.
Tensor all_gather_linear(const Tensor& x_shard, const Tensor& weight, const Tensor& bias,
                         const TensorParallelGroup& tp);

// Sequence-parallel exit of a row-parallel linear: x [B, T, Inl], weight [N, Inl]: the partial
// product x W^T is reduce-scattered along dim 1 into y [B, T/P, N], and bias [N] (replicated, or
// undefined) is added once, to this rank's own rows (it rides the last chunk's product).
// Backward: grad_y [B, T/P, N] is all-gathered along dim 1; grad_x [B, T, Inl] = grad W;
// grad_weight = grad^T x; grad_bias = this rank's rows of grad_y summed (Partial over tp).
Tensor linear_reduce_scatter(const Tensor& x, const Tensor& weight, const Tensor& bias, const TensorParallelGroup& tp);

// Column-parallel linear without sequence parallelism: x [..., In] replicated, weight [Nl, In],
// bias [Nl] or undefined: y [..., Nl] = x W^T + b, local. Backward: grad_x = grad_y W is a partial
// sum, all-reduced on tp.stream while grad_weight's matmul runs.
Tensor column_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const TensorParallelGroup& tp);

// Row-parallel linear without sequence parallelism: x [..., Inl], weight [N, Inl], bias [N]
// replicated or undefined: y [..., N] = all_reduce(x W^T) + b, the bias added once, after the sum.
// Backward: local (the output is replicated, so every rank holds the whole grad_y).
Tensor row_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const TensorParallelGroup& tp);

}  // namespace weft
