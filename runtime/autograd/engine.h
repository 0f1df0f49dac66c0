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

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph = false);

// backward that stops at `inputs` (leaves that require grad, such as a model segment's input):
// the gradient summed at each input is returned, in order, instead of being accumulated into its
// .grad (undefined where none arrived), so no copy is made. Other leaves accumulate as usual.
std::vector<Tensor> backward_to_inputs(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                                       const std::vector<Tensor>& inputs);

// True on this thread while a backward that frees each node's saved tensors right after the node
// runs (retain_graph false; backward_to_inputs always) walks the graph. A node's backward may then
// write its result into the bytes of a saved tensor that nothing else holds (storage use count 1):
// nobody can read them again. False outside a backward and in one that retains the graph.
bool backward_frees_saved_tensors();

}  // namespace weft::autograd
