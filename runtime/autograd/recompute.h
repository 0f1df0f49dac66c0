// Activation recomputation: trading backward-time FLOPs for activation memory.
//
// Two tools, one for each granularity of train.recompute (layers/transformer_block.h):
//
// recompute(function, inputs, ...) is classic activation checkpointing. The forward runs `function`
// with grad mode off, so none of its intermediate tensors is saved; only `inputs` are kept. When
// backward reaches its outputs, it runs `function` again on detached copies of the inputs with grad
// mode on, backpropagates the outputs' gradients through that fresh graph, and passes the inputs'
// gradients on. Parameters the function reads get their gradients (and fire their grad-ready hooks)
// during that inner backward, and weight-gradient deferral (deferred_weight_gradients.h) applies to
// it as to any backward on the thread. Used for a whole transformer block (full).
//
//   std::vector<Tensor> out = autograd::recompute(
//       [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{block_body(in[0])}; }, {x},
//       block_parameters, dropout_counters);
//
// release_until_backward(consumer_output, activation, rebuild) is Megatron's "checkpoint without
// output", for a large activation that one later op (its consumer) saves for backward, such as an
// MLP's hidden [B, T, 4C] that the output projection saves. Once the consumer has run, the
// activation's bytes are freed; the consumer's output is returned through an identity whose backward
// first calls rebuild() (with grad mode off) and moves the result's bytes back under the activation,
// so the consumer's backward, which runs after it, finds them. The producer's own backward must not
// read the activation (gelu's and mul's read their inputs, not their output). output_rebuilder makes
// rebuild from the producer itself (Function::rebuild_output: GELU from the pre-activation it
// saved). Used for the MLP's hidden activation and rotary's q and k (selective).
//
// Invariants:
// - `function` must compute the same values on every call. State it reads and advances besides its
//   tensors, such as dropout streams' counters, is handed over as a ReplayedCounters: read before the
//   first run, written back for the rerun, and afterwards returned to what backward found (other
//   micro-batches' forwards may have moved it on meanwhile). On the CPU the rerun is then bitwise the
//   first run, and so are the gradients.
// - Forward outputs are new tensors (recompute) or the consumer's own output (release_until_backward):
//   callers use them as they would the direct results.
// - Collectives inside `function` (a tensor-parallel block in the manual comm mode) run again in
//   backward, in the same order on every rank of the group; that extra communication is the price.
// - With grad mode off, or when nothing requires grad, both run the plain computation and save nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/tensor.h"

namespace weft::autograd {

// Counters that `function` advances each time it runs (dropout streams' Philox offsets).
struct ReplayedCounters {
  std::function<std::vector<uint64_t>()> read;
  std::function<void(const std::vector<uint64_t>&)> write;
  bool empty() const { return read == nullptr; }
};

using RecomputedFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// function(inputs), keeping only `inputs` (detached) for backward and rerunning `function` there.
// `parameters`: other tensors `function` reads whose gradients are wanted; they only decide whether
// history is recorded when no input requires grad (their gradients arrive through the rerun).
std::vector<Tensor> recompute(const RecomputedFunction& function, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& parameters = {}, const ReplayedCounters& counters = {});

// Frees `activation`'s bytes (it must fill its storage, contiguous or a permutation of contiguous)
// and returns `consumer_output` through an identity whose backward refills them from rebuild(), a
// tensor of activation's shape and dtype computed the way the activation was (copied into the
// activation's layout when its strides differ).
Tensor release_until_backward(const Tensor& consumer_output, const Tensor& activation,
                              std::function<Tensor()> rebuild);

// rebuild for release_until_backward from the op that made `output`: it computes the output again
// from the tensors that op saved for its own backward (Function::rebuild_output), so it keeps no
// tensor of its own. Null when the op cannot (or `output` has no history).
std::function<Tensor()> output_rebuilder(const Tensor& output);

}  // namespace weft::autograd
