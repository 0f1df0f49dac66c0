// The backward graph: nodes, edges, and the per-tensor autograd record.
//
// An op that ran with grad mode on and an input requiring grad creates one Node. The node's
// `next_edges` point, per forward input, at the node that produced that input (or at the input's
// AccumulateGrad node when the input is a leaf that requires grad; a null edge when no gradient
// flows there). Each output tensor remembers (grad_fn, output_index).
//
// Nodes save only detached tensors (data without history), so the graph has no cycles: a tensor
// owns its grad_fn, a node owns the nodes behind it, and nothing points forward.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace weft::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: no gradient flows to this input
  int input_index = 0;         // which of node's gradient inputs (its forward outputs) this feeds
  bool valid() const { return node != nullptr; }
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // A readable name for errors and graph dumps ("MatmulBackward").
  virtual std::string name() const = 0;
  // Gradients w.r.t. the forward outputs (one per output; undefined where no gradient arrived) ->
  // gradients w.r.t. the forward inputs (one per next edge; undefined for none). Runs with grad
  // mode off.
  virtual std::vector<Tensor> run_backward(std::vector<Tensor> grad_outputs) = 0;
  // Frees saved tensors once a backward pass no longer needs them.
  virtual void release_saved() {}
  // True when the node must run even though no gradient arrived through its edges (an
  // AccumulateGrad whose gradient an op added in place: its hooks must still fire).
  virtual bool has_pending_gradient() const { return false; }

  int num_outputs() const { return num_outputs_; }
  void set_num_outputs(int count) { num_outputs_ = count; }
  // Shapes of the forward outputs, to materialise zero gradients and check shapes.
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  std::vector<Device> output_devices;
  std::vector<Edge> next_edges;
  // Creation order: backward runs later nodes first, so gradients of the last layers become ready
  // first (what data-parallel bucketing wants).
  uint64_t sequence_number() const { return sequence_number_; }
  // Among ready nodes the engine runs the highest priority first: the sequence number, except for
  // AccumulateGrad, which runs as soon as it is ready (it is created once per parameter, so its
  // sequence number says nothing about the current step).
  virtual uint64_t priority() const { return sequence_number_; }

  // How many edges lead into output `index`, counted as consumers connect (connect()). A consumer
  // may hand this node a gradient in another form than the output's (linear handing the GELU
  // linear before it the gradient of its pre-activation) only when it is the output's one use:
  // then no other gradient is summed with it. Uses that never see a backward still count, which
  // only ever withholds such a handover. Counted while the graph is built on one thread.
  int output_uses(int index) const {
    return index < static_cast<int>(output_uses_.size()) ? output_uses_[static_cast<size_t>(index)] : 0;
  }
  void add_output_use(int index) {
    if (index >= static_cast<int>(output_uses_.size())) output_uses_.resize(static_cast<size_t>(index) + 1, 0);
    ++output_uses_[static_cast<size_t>(index)];
  }

 private:
  int num_outputs_ = 1;
  uint64_t sequence_number_;
  std::vector<int> output_uses_;
};

// Accumulates the incoming gradient into a leaf tensor's .grad and fires its grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  uint64_t priority() const override { return UINT64_MAX; }
  std::vector<Tensor> run_backward(std::vector<Tensor> grad_outputs) override;

  // For an op that can add its gradient into the leaf's .grad itself (a GEMM with beta = 1: one
  // kernel instead of a product into a new tensor and an add): the leaf's .grad when it exists, is
  // contiguous and has the leaf's shape and `dtype`; else undefined, and the op returns its
  // gradient as usual. An op that wrote into it calls gradient_added_in_place() and returns an
  // undefined gradient for this edge; the engine still runs this node once all its edges are done
  // (has_pending_gradient), so the grad-ready hooks fire once per pass with every contribution in,
  // as for gradients that arrive through the edges (a tied weight's other use, for one).
  Tensor gradient_storage(DType dtype) const;
  // True when that storage's contents count as zeros without having been written (the gradient
  // buffer's lazy zeroing, Tensor::mark_grad_zero): the op writes its gradient into it (a GEMM with
  // beta = 0) instead of adding, and must not read it.
  bool gradient_storage_counts_as_zero() const;
  // Writes the zeros that storage counts as, if it does (for an op that can only add into it).
  void write_counted_zeros() const;
  // Also ends the storage's counting as zero: it now holds the op's gradient.
  void gradient_added_in_place();
  bool has_pending_gradient() const override { return added_in_place_; }

 private:
  std::weak_ptr<TensorImpl> leaf_;
  bool added_in_place_ = false;  // since the last run_backward
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  // .grad keeps its storage, but its contents count as zeros (Tensor::mark_grad_zero): the first
  // gradient accumulated overwrites them, and Tensor::grad() writes the zeros if read before that.
  bool grad_counts_as_zero = false;
  std::shared_ptr<Node> grad_fn;   // null for leaves
  int output_index = 0;
  std::shared_ptr<AccumulateGrad> grad_accumulator;  // leaves that require grad
  std::vector<std::function<void(Tensor&)>> grad_ready_hooks;
};

// The edge through which a gradient for `tensor` flows: its grad_fn, its accumulator (creating it
// for a leaf that requires grad), or an invalid edge.
Edge gradient_edge(const Tensor& tensor);

// The edge's node as an AccumulateGrad (the edge leads straight to a leaf), or null.
std::shared_ptr<AccumulateGrad> leaf_accumulator(const Edge& edge);

// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(absl::Span<const Tensor> tensors);

// Makes `output` the `output_index`-th result of `node` (sets requires_grad and grad_fn).
void set_history(const Tensor& output, const std::shared_ptr<Node>& node, int output_index);

// Creates the edges of `node` from its forward inputs and records output metadata.
void connect(Node& node, absl::Span<const Tensor> inputs);

}  // namespace weft::autograd
