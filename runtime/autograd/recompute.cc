// recompute and release_until_backward (recompute.h).
#include "runtime/autograd/recompute.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/node.h"
#include "runtime/error.h"

namespace weft::autograd {
namespace {

// Grad mode on for a scope: the engine runs backward with it off, and the rerun must record.
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode_enabled(true); }
  ~EnableGradGuard() { set_grad_mode_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Puts the counters at `replayed` for a scope and back at what they were when it ends (also when
// the rerun throws), so the next micro-batch's forward continues where it would have.
class ReplayCounters {
 public:
  ReplayCounters(const ReplayedCounters& counters, const std::vector<uint64_t>& replayed) : counters_(counters) {
    if (counters_.empty()) return;
    now_ = counters_.read();
    counters_.write(replayed);
  }
  ~ReplayCounters() {
    if (!counters_.empty()) counters_.write(now_);
  }
  ReplayCounters(const ReplayCounters&) = delete;
  ReplayCounters& operator=(const ReplayCounters&) = delete;

 private:
  const ReplayedCounters& counters_;
  std::vector<uint64_t> now_;
};

class RecomputeBackward final : public Node {
 public:
  RecomputeBackward(RecomputedFunction function, const std::vector<Tensor>& inputs, ReplayedCounters counters,
                    std::vector<uint64_t> counters_before)
      : function_(std::move(function)), counters_(std::move(counters)), counters_before_(std::move(counters_before)) {
    for (const Tensor& input : inputs) {
      inputs_.push_back(input.defined() ? input.detach() : Tensor());
      input_requires_grad_.push_back(input.defined() && input.requires_grad());
    }
  }
  std::string name() const override { return "RecomputeBackward"; }
  void release_saved() override {
    inputs_.clear();
    released_ = true;
  }

  std::vector<Tensor> run_backward(std::vector<Tensor> grad_outputs) override {
    WEFT_CHECK(!released_, name(), ": backward through a recomputed region whose inputs were already freed; pass "
               "retain_graph=true to the first backward() to run backward twice");
    // Fresh leaves for the rerun: the inner backward stops at them and hands their gradients back.
    std::vector<Tensor> leaves;
    std::vector<Tensor> stops;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor leaf = inputs_[i].defined() ? inputs_[i].detach() : Tensor();
      if (input_requires_grad_[i]) {
        leaf.set_requires_grad(true);
        stops.push_back(leaf);
      }
      leaves.push_back(leaf);
    }
    std::vector<Tensor> outputs;
    {
      ReplayCounters replay(counters_, counters_before_);
      EnableGradGuard enable_grad;
      outputs = function_(leaves);
    }
    WEFT_CHECK(outputs.size() == grad_outputs.size(), name(), ": the rerun returned ", outputs.size(),
               " outputs, the first run ", grad_outputs.size(), "; a recomputed function must be deterministic");
    std::vector<Tensor> roots;
    std::vector<Tensor> root_gradients;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!grad_outputs[i].defined() || !outputs[i].requires_grad()) continue;
      roots.push_back(outputs[i]);
      root_gradients.push_back(grad_outputs[i]);
    }
    std::vector<Tensor> input_gradients(inputs_.size());
    if (roots.empty()) return input_gradients;
    if (stops.empty()) {
      backward(roots, root_gradients);  // parameters' gradients only
      return input_gradients;
    }
    const std::vector<Tensor> stopped = backward_to_inputs(roots, root_gradients, stops);
    size_t next = 0;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (input_requires_grad_[i]) input_gradients[i] = stopped[next++];
    }
    return input_gradients;
  }

 private:
  RecomputedFunction function_;
  std::vector<Tensor> inputs_;  // detached
  std::vector<bool> input_requires_grad_;
  ReplayedCounters counters_;
  std::vector<uint64_t> counters_before_;  // as the first run found them
  bool released_ = false;
};

// The dims of `tensor` from the largest stride to the smallest (size-1 dims last, in order).
std::vector<int64_t> dims_by_stride(const Tensor& tensor) {
  std::vector<int64_t> order(static_cast<size_t>(tensor.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&tensor](int64_t a, int64_t b) {
    const bool a_one = tensor.size(a) == 1, b_one = tensor.size(b) == 1;
    if (a_one != b_one) return b_one;
    return !a_one && tensor.stride(a) > tensor.stride(b);
  });
  return order;
}

// Whether `tensor` is a permutation of a contiguous tensor (such as rotary's heads-inner q and k,
// [B, H, T, D] over [B, T, H, D] bytes) that starts its storage and fills it.
bool fills_storage_densely(const Tensor& tensor) {
  if (tensor.raw_data() != tensor.storage()->data() ||
      tensor.storage()->bytes() != static_cast<size_t>(tensor.numel()) * dtype_size(tensor.dtype())) {
    return false;
  }
  int64_t expected = 1;
  const std::vector<int64_t> order = dims_by_stride(tensor);
  for (auto dim = order.rbegin(); dim != order.rend(); ++dim) {
    if (tensor.size(*dim) == 1) continue;
    if (tensor.stride(*dim) != expected) return false;
    expected *= tensor.size(*dim);
  }
  return true;
}

// A new tensor with `like`'s shape, dtype, device and stride order (fills_storage_densely).
Tensor empty_in_layout_of(const Tensor& like) {
  const std::vector<int64_t> order = dims_by_stride(like);
  Shape ordered_shape;
  for (int64_t dim : order) ordered_shape.push_back(like.size(dim));
  std::vector<int64_t> back(order.size());
  for (size_t i = 0; i < order.size(); ++i) back[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return Tensor::empty(ordered_shape, like.dtype(), like.device()).permute(back);
}

// Identity on the consumer's output; its backward puts the activation's bytes back first, laid
// out as the activation was (the consumer's saved aliases keep its strides).
class RebuildActivationBackward final : public Node {
 public:
  RebuildActivationBackward(std::function<Tensor()> rebuild, const Tensor& activation)
      : rebuild_(std::move(rebuild)), activation_(activation.detach()) {}
  std::string name() const override { return "RebuildActivationBackward"; }
  // What rebuild() captured (the tensors it recomputes from) goes with the graph's saved tensors.
  void release_saved() override { rebuild_ = nullptr; }

  std::vector<Tensor> run_backward(std::vector<Tensor> grad_outputs) override {
    Storage& storage = *activation_.storage();
    if (storage.released()) {
      WEFT_CHECK(rebuild_ != nullptr, name(), ": backward through a released activation whose rebuild was already "
                 "freed; pass retain_graph=true to the first backward() to run backward twice");
      Tensor rebuilt = rebuild_();
      WEFT_CHECK(rebuilt.shape() == activation_.shape() && rebuilt.dtype() == activation_.dtype(), name(),
                 ": rebuild() gave ", rebuilt.describe(), " for an activation of shape ",
                 shape_string(activation_.shape()), " and dtype ", dtype_name(activation_.dtype()));
      // The rebuilt tensor's own bytes when they are exactly the activation's layout (the usual case: a
      // fresh result computed the way the activation was), otherwise a copy laid out so.
      const bool same_layout = rebuilt.strides() == activation_.strides() &&
                               rebuilt.storage()->bytes() == storage.bytes() && rebuilt.storage().use_count() == 1 &&
                               rebuilt.raw_data() == rebuilt.storage()->data();
      if (!same_layout) {
        Tensor copy = empty_in_layout_of(activation_);
        copy.copy_(rebuilt);
        rebuilt = copy;
      }
      storage.adopt(*rebuilt.storage());
    }
    return {std::move(grad_outputs[0])};
  }

 private:
  std::function<Tensor()> rebuild_;
  Tensor activation_;  // a detached alias: the storage to refill, the shape, dtype and strides to refill it in
};

}  // namespace

std::vector<Tensor> recompute(const RecomputedFunction& function, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& parameters, const ReplayedCounters& counters) {
  if (!any_requires_grad(inputs) && !any_requires_grad(parameters)) return function(inputs);
  std::vector<uint64_t> counters_before = counters.empty() ? std::vector<uint64_t>() : counters.read();
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = function(inputs);
  }
  auto node = std::make_shared<RecomputeBackward>(function, inputs, counters, std::move(counters_before));
  connect(*node, inputs);
  node->set_num_outputs(static_cast<int>(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& output = outputs[i];
    WEFT_CHECK(output.defined(), "recompute: the function returned an undefined output ", i);
    node->output_shapes.push_back(output.shape());
    node->output_dtypes.push_back(output.dtype());
    node->output_devices.push_back(output.device());
    if (!is_floating(output.dtype())) continue;
    // An output that is an input (or has history) gets its own handle, as in apply_function.
    bool aliases_input = output.impl()->autograd != nullptr;
    for (const Tensor& input : inputs) aliases_input |= input.defined() && input.is_same(output);
    if (aliases_input) output = output.detach();
    set_history(output, node, static_cast<int>(i));
  }
  return outputs;
}

Tensor release_until_backward(const Tensor& consumer_output, const Tensor& activation,
                              std::function<Tensor()> rebuild) {
  if (!grad_mode_enabled() || !consumer_output.requires_grad()) return consumer_output;
  WEFT_CHECK(fills_storage_densely(activation), "release_until_backward: the activation ", activation.describe(),
             " must be a whole dense tensor, contiguous or permuted (not a view into a larger one)");
  WEFT_CHECK(!activation.is_same(consumer_output) && activation.storage() != consumer_output.storage(),
             "release_until_backward: the consumer's output shares the activation's bytes");
  auto node = std::make_shared<RebuildActivationBackward>(std::move(rebuild), activation);
  connect(*node, {consumer_output});
  node->set_num_outputs(1);
  node->output_shapes.push_back(consumer_output.shape());
  node->output_dtypes.push_back(consumer_output.dtype());
  node->output_devices.push_back(consumer_output.device());
  Tensor out = consumer_output.detach();
  set_history(out, node, 0);
  activation.storage()->release();
  return out;
}

std::function<Tensor()> output_rebuilder(const Tensor& output) {
  const std::shared_ptr<Function> function = std::dynamic_pointer_cast<Function>(output.grad_fn());
  if (function == nullptr) return nullptr;
  const int index = output.impl()->autograd->output_index;
  if (!function->can_rebuild_output(index)) return nullptr;
  return [function, index] {
    WEFT_CHECK(!function->saved_released(), function->name(), ": its output ", index,
               " cannot be rebuilt: its saved tensors were freed (its backward ran before its consumer's)");
    NoGradGuard no_grad;
    return function->rebuild_output(index);
  };
}

}  // namespace weft::autograd
