#include "runtime/autograd/node.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace weft::autograd {
namespace {
std::atomic<uint64_t> next_sequence_number{0};
}  // namespace

Node::Node() : sequence_number_(next_sequence_number.fetch_add(1, std::memory_order_relaxed)) {}

std::vector<Tensor> AccumulateGrad::run_backward(std::vector<Tensor> grad_outputs) {
  const bool added_in_place = added_in_place_;
  added_in_place_ = false;
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  const Tensor& incoming = grad_outputs[0];
  if (impl == nullptr || (!incoming.defined() && !added_in_place)) return {};
  Tensor leaf(impl);
  AutogradMeta& meta = *impl->autograd;
  if (incoming.defined()) {
    WEFT_CHECK(incoming.shape() == leaf.shape(), "backward: the gradient for leaf ", leaf.describe(), " has shape ",
               shape_string(incoming.shape()), "; a custom op's backward returned a gradient of the wrong shape");
    if (!meta.grad.defined()) {
      // Own the buffer: the incoming gradient may be shared with other branches of the graph.
      Tensor grad = Tensor::empty(leaf.shape(), leaf.dtype(), leaf.device());
      grad.copy_(incoming);
      meta.grad = grad;
    } else if (meta.grad_counts_as_zero) {
      meta.grad.copy_(incoming);  // zeros plus incoming, without writing the zeros first
      meta.grad_counts_as_zero = false;
    } else {
      backend_for(leaf.device()).binary(BinaryOp::kAdd, meta.grad, incoming.to(meta.grad.dtype()), meta.grad);
    }
  }
  for (auto& hook : meta.grad_ready_hooks) hook(leaf);
  return {};
}

Tensor AccumulateGrad::gradient_storage(DType dtype) const {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  if (impl == nullptr || impl->autograd == nullptr) return Tensor();
  const Tensor leaf(impl);
  const Tensor& grad = impl->autograd->grad;
  if (!grad.defined() || !grad.is_contiguous() || grad.dtype() != dtype || grad.shape() != leaf.shape() ||
      grad.device() != leaf.device()) {
    return Tensor();
  }
  return grad;
}

bool AccumulateGrad::gradient_storage_counts_as_zero() const {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  return impl != nullptr && impl->autograd != nullptr && impl->autograd->grad_counts_as_zero;
}

void AccumulateGrad::write_counted_zeros() const {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  if (impl != nullptr) Tensor(impl).grad();  // grad() writes them
}

void AccumulateGrad::gradient_added_in_place() {
  added_in_place_ = true;
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  if (impl != nullptr && impl->autograd != nullptr) impl->autograd->grad_counts_as_zero = false;
}

Edge gradient_edge(const Tensor& tensor) {
  if (!tensor.defined()) return {};
  TensorImpl* impl = tensor.impl();
  if (impl->autograd == nullptr || !impl->autograd->requires_grad) return {};
  AutogradMeta& meta = *impl->autograd;
  if (meta.grad_fn != nullptr) return {meta.grad_fn, meta.output_index};
  if (meta.grad_accumulator == nullptr) {
    meta.grad_accumulator = std::make_shared<AccumulateGrad>(tensor.impl_ptr());
    // Lets the engine check gradient shapes for leaves too, naming the op that produced a bad one.
    meta.grad_accumulator->output_shapes = {tensor.shape()};
  }
  return {meta.grad_accumulator, 0};
}

std::shared_ptr<AccumulateGrad> leaf_accumulator(const Edge& edge) {
  return std::dynamic_pointer_cast<AccumulateGrad>(edge.node);
}

bool any_requires_grad(absl::Span<const Tensor> tensors) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& tensor : tensors) {
    if (tensor.defined() && tensor.requires_grad()) return true;
  }
  return false;
}

void set_history(const Tensor& output, const std::shared_ptr<Node>& node, int output_index) {
  TensorImpl* impl = output.impl();
  if (impl->autograd == nullptr) impl->autograd = std::make_shared<AutogradMeta>();
  impl->autograd->requires_grad = true;
  impl->autograd->grad_fn = node;
  impl->autograd->output_index = output_index;
}

void connect(Node& node, absl::Span<const Tensor> inputs) {
  node.next_edges.clear();
  for (const Tensor& input : inputs) {
    node.next_edges.push_back(gradient_edge(input));
    const Edge& edge = node.next_edges.back();
    if (edge.valid()) edge.node->add_output_use(edge.input_index);
  }
}

}  // namespace weft::autograd
