// The backward engine.
//
// backward(roots, gradients) walks the graph behind the roots once, in reverse topological order
// (among ready nodes, the most recently created first), sums the gradients that arrive at each
// node before running it, and hands the result to each leaf's AccumulateGrad. After a node runs,
// its saved tensors are freed unless retain_graph is set; a second backward through a freed graph
// is an error that says so.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace weft::autograd {

struct Edge;

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph = false);

// backward that stops at `inputs` (leaves that require grad, such as a model segment's input):
// the gradient summed at each input is returned, in order, instead of being accumulated into its
// .grad (undefined where none arrived), so no copy is made. Other leaves accumulate as usual.
// `producers` (empty, or one per input, each undefined or not) names, for an input, the tensor
// whose backward the caller will start from the input's returned gradient, unchanged (a model
// segment's input is the detached output of the segment below: parallel/step/step_builder.h).
// Inside this walk, gradient_destination then sees through the input to that tensor's producer.
std::vector<Tensor> backward_to_inputs(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                                       const std::vector<Tensor>& inputs, const std::vector<Tensor>& producers = {});

// True on this thread while a backward that frees each node's saved tensors right after the node
// runs (retain_graph false; backward_to_inputs always) walks the graph. A node's backward may then
// write its result into the bytes of a saved tensor that nothing else holds (storage use count 1):
// nobody can read them again. False outside a backward and in one that retains the graph.
bool backward_frees_saved_tensors();

// Inside a node's backward, run by the engine on this thread: the gradient summed so far for `edge`
// (one of the running node's next_edges) from the nodes that ran before, taken out of the engine's
// buffer, when it is contiguous with `numel` elements of `dtype` on `device`; else (none arrived,
// another layout, or outside a backward) undefined, and the buffer keeps it. The caller must add
// what it took into the gradient it returns for that edge: the engine would have summed the two.
// This lets an op fold the sum into its own kernel instead of the engine's separate add (a norm's
// backward adding the residual stream's gradient in the pass that writes grad_x). Gradients that
// arrive later are summed by the engine as usual. The tensor may be shared with other edges' slots
// (an add hands one tensor to both its inputs): read it, never write it.
Tensor take_pending_gradient(const Edge& edge, DType dtype, int64_t numel, const Device& device);

// Inside a node's backward, run by the engine on this thread: true when the gradient the running
// node returns for `edge` (one of its next_edges) will be all that edge.node receives for that
// output: nothing waits in its slot (none arrived before, or take_pending_gradient took it) and no
// node that has yet to run has an edge into edge.node besides this one (nor has the running node a
// second). False outside a backward. An op may then compute, from the gradient it writes, part of
// edge.node's backward (a norm's kernel summing grad_x's columns for the bias gradient of the
// linear that produced x: runtime/ops/bias_gradient_handoff.h).
bool receives_only_this_gradient(const Edge& edge);

// Inside a node's backward, run by the engine on this thread: where the gradient the running node
// returns for `edge` ends up. That is `edge` itself, except where edge.node is an input of
// backward_to_inputs given a producer tensor: then the producer's gradient edge, whose node the
// caller's next backward starts with the input's gradient as the tensor's. (With
// receives_only_this_gradient(edge), what the running node returns is then all the producer's
// output receives.) Outside a backward, `edge`.
Edge gradient_destination(const Edge& edge);

}  // namespace weft::autograd
