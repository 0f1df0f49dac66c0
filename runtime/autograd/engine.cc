#include "runtime/autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/node.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace weft::autograd {
namespace {

// Sum of two gradients into a new tensor (never in place: either may be shared).
Tensor add_gradients(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  backend_for(a.device()).binary(BinaryOp::kAdd, a, b.dtype() == a.dtype() ? b : b.to(a.dtype()), out);
  return out;
}

thread_local bool frees_saved_tensors = false;

// The walk running on this thread, as take_pending_gradient, receives_only_this_gradient and
// gradient_destination see it: per node one gradient slot per forward output, how many edges from
// nodes yet to run lead into each node (the running node's included until it has run), the running
// node, and the producers' edges of the stops that backward_to_inputs was given producers for.
using GradientBuffers = std::unordered_map<Node*, std::vector<Tensor>>;
struct Walk {
  GradientBuffers buffers;
  std::unordered_map<Node*, int> dependencies;
  const Node* running = nullptr;
  std::unordered_map<const Node*, Edge> producers_of_stops;
};
thread_local Walk* current_walk = nullptr;  // null outside a walk

// Points current_walk at one walk and restores the outer walk after (recomputation runs a backward
// inside a node's backward).
class CurrentWalkScope {
 public:
  explicit CurrentWalkScope(Walk* walk) : before_(current_walk) { current_walk = walk; }
  ~CurrentWalkScope() { current_walk = before_; }
  CurrentWalkScope(const CurrentWalkScope&) = delete;
  CurrentWalkScope& operator=(const CurrentWalkScope&) = delete;

 private:
  Walk* before_;
};

// Sets frees_saved_tensors for one walk and restores it after (a backward may run inside another
// node's backward, as recomputation does).
class FreesSavedTensorsScope {
 public:
  explicit FreesSavedTensorsScope(bool frees) : before_(frees_saved_tensors) { frees_saved_tensors = frees; }
  ~FreesSavedTensorsScope() { frees_saved_tensors = before_; }
  FreesSavedTensorsScope(const FreesSavedTensorsScope&) = delete;
  FreesSavedTensorsScope& operator=(const FreesSavedTensorsScope&) = delete;

 private:
  bool before_;
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->priority() < b->priority(); }
};

}  // namespace

namespace {

// The walk behind backward and backward_to_inputs: `stops` are accumulator nodes whose summed
// gradient is stored in `stopped` (same index) instead of being run.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph,
                  const std::vector<Node*>& stops, std::vector<Tensor>* stopped,
                  std::unordered_map<const Node*, Edge> producers_of_stops = {}) {
  WEFT_CHECK(roots.size() == gradients.size(), "backward: ", roots.size(), " roots but ", gradients.size(),
             " gradients");
  NoGradGuard no_grad;
  const FreesSavedTensorsScope frees_scope(!retain_graph);

  // Gradient buffers per node (one slot per forward output), and the roots' contributions.
  Walk walk;
  walk.producers_of_stops = std::move(producers_of_stops);
  const CurrentWalkScope walk_scope(&walk);
  GradientBuffers& buffers = walk.buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  auto deposit = [&](const Edge& edge, const Tensor& gradient) {
    std::vector<Tensor>& slots = buffers[edge.node.get()];
    if (slots.empty()) slots.resize(edge.node->num_outputs());
    Tensor& slot = slots[edge.input_index];
    slot = slot.defined() ? add_gradients(slot, gradient) : gradient;
  };

  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    WEFT_CHECK(root.defined(), "backward: root ", i, " is undefined");
    WEFT_CHECK(root.requires_grad(), "backward: the tensor ", root.describe(),
               " does not require grad and has no grad_fn (was it computed under NoGradGuard, or from "
               "tensors without set_requires_grad(true)?)");
    Tensor gradient = gradients[i];
    if (!gradient.defined()) {
      WEFT_CHECK(root.numel() == 1, "backward: a gradient must be given for the non-scalar root ",
                 root.describe());
      gradient = Tensor::ones(root.shape(), root.dtype(), root.device());
    }
    WEFT_CHECK(gradient.shape() == root.shape() && gradient.dtype() == root.dtype() &&
                   gradient.device() == root.device(),
               "backward: gradient ", gradient.describe(), " does not match root ", root.describe(),
               " (shape, dtype and device must agree; convert it with .to())");
    root_edges.push_back(gradient_edge(root));
    owners[root_edges.back().node.get()] = root_edges.back().node;
    deposit(root_edges.back(), gradient);
  }

  // Count, for each reachable node, how many edges lead into it.
  std::unordered_map<Node*, int>& dependencies = walk.dependencies;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& edge : root_edges) {
    if (!seen[edge.node.get()]) {
      seen[edge.node.get()] = true;
      stack.push_back(edge.node.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges) {
      if (!next.valid()) continue;
      dependencies[next.node.get()] += 1;
      owners[next.node.get()] = next.node;
      if (!seen[next.node.get()]) {
        seen[next.node.get()] = true;
        stack.push_back(next.node.get());
      }
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (const Edge& edge : root_edges) {
    if (dependencies[edge.node.get()] == 0) {
      dependencies[edge.node.get()] = -1;  // queued once even when several roots share it
      ready.push(edge.node.get());
    }
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> inputs = std::move(buffers[node]);
    buffers.erase(node);
    if (inputs.empty()) inputs.resize(node->num_outputs());
    const auto stop = std::find(stops.begin(), stops.end(), node);
    if (stop != stops.end()) {
      (*stopped)[stop - stops.begin()] = inputs[0];
      continue;
    }
    // A node that received no gradient at all (a custom op returned none for this path) passes none
    // on: built-in backwards expect at least one gradient, and zeros would only cost time.
    // (An AccumulateGrad whose gradient an op added in place runs all the same, to fire its hooks.)
    const bool any_gradient = std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined(); });
    walk.running = node;
    std::vector<Tensor> outputs = any_gradient || node->has_pending_gradient() ? node->run_backward(std::move(inputs))
                                                                               : std::vector<Tensor>();
    walk.running = nullptr;
    if (!retain_graph) node->release_saved();
    WEFT_CHECK(outputs.size() == node->next_edges.size() || outputs.empty(), node->name(), " returned ",
               outputs.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& next = node->next_edges[i];
      if (!next.valid()) continue;
      if (i < outputs.size() && outputs[i].defined()) {
        const Tensor& gradient = outputs[i];
        if (next.input_index < static_cast<int>(next.node->output_shapes.size())) {
          WEFT_CHECK(gradient.shape() == next.node->output_shapes[next.input_index], node->name(),
                     ": gradient for input ", i, " has shape ", shape_string(gradient.shape()), ", expected ",
                     shape_string(next.node->output_shapes[next.input_index]));
        }
        deposit(next, gradient);
      }
      if (--dependencies[next.node.get()] == 0) ready.push(next.node.get());
    }
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph) {
  run_backward(roots, gradients, retain_graph, {}, nullptr);
}

std::vector<Tensor> backward_to_inputs(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                                       const std::vector<Tensor>& inputs, const std::vector<Tensor>& producers) {
  WEFT_CHECK(producers.empty() || producers.size() == inputs.size(), "backward_to_inputs: ", producers.size(),
             " producers for ", inputs.size(), " inputs (give none, or one per input)");
  std::vector<Node*> stops;
  std::unordered_map<const Node*, Edge> producers_of_stops;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    WEFT_CHECK(input.defined() && input.is_leaf() && input.requires_grad(), "backward_to_inputs: input ",
               input.defined() ? input.describe() : std::string("(undefined)"), " is not a leaf that requires grad");
    stops.push_back(gradient_edge(input).node.get());
    if (i < producers.size() && producers[i].defined() && producers[i].requires_grad()) {
      producers_of_stops[stops.back()] = gradient_edge(producers[i]);
    }
  }
  std::vector<Tensor> stopped(inputs.size());
  run_backward(roots, gradients, /*retain_graph=*/false, stops, &stopped, std::move(producers_of_stops));
  return stopped;
}

bool backward_frees_saved_tensors() { return frees_saved_tensors; }

Tensor take_pending_gradient(const Edge& edge, DType dtype, int64_t numel, const Device& device) {
  if (current_walk == nullptr || !edge.valid()) return Tensor();
  auto found = current_walk->buffers.find(edge.node.get());
  if (found == current_walk->buffers.end() || edge.input_index >= static_cast<int>(found->second.size())) {
    return Tensor();
  }
  Tensor& slot = found->second[static_cast<size_t>(edge.input_index)];
  if (!slot.defined() || slot.dtype() != dtype || slot.numel() != numel || slot.device() != device ||
      !slot.is_contiguous()) {
    return Tensor();
  }
  Tensor taken = slot;
  slot = Tensor();  // the caller's gradient, which includes this one, takes its place
  return taken;
}

bool receives_only_this_gradient(const Edge& edge) {
  if (current_walk == nullptr || current_walk->running == nullptr || !edge.valid()) return false;
  const auto found = current_walk->buffers.find(edge.node.get());
  if (found != current_walk->buffers.end() && edge.input_index < static_cast<int>(found->second.size()) &&
      found->second[static_cast<size_t>(edge.input_index)].defined()) {
    return false;
  }
  const auto waiting = current_walk->dependencies.find(edge.node.get());
  if (waiting == current_walk->dependencies.end()) return false;
  // Exactly one edge, the running node's: a node that the running node reaches by two edges (an
  // add of a tensor to itself) receives two gradients, whose sum no single one describes.
  const int from_running = static_cast<int>(
      std::count_if(current_walk->running->next_edges.begin(), current_walk->running->next_edges.end(),
                    [&](const Edge& next) { return next.node == edge.node; }));
  return from_running == 1 && waiting->second == 1;
}

Edge gradient_destination(const Edge& edge) {
  if (current_walk == nullptr || !edge.valid()) return edge;
  const auto found = current_walk->producers_of_stops.find(edge.node.get());
  return found != current_walk->producers_of_stops.end() ? found->second : edge;
}

}  // namespace weft::autograd
