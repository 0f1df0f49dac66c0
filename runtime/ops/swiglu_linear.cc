// Differentiable gated linear pair (swiglu_linear.h).
#include "runtime/ops/swiglu_linear.h"

#include <memory>
#include <utility>

#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/linear_parameter_gradients.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/swiglu_gradient_handoff.h"

namespace weft {
namespace {

// The two weights' .grad as one [2, H, C] tensor when they lie one right after the other in one
// storage, `gate_first` naming which comes first, and both count as zero or neither does (one beta
// for the one product); otherwise undefined.
Tensor adjacent_gradients(autograd::AccumulateGrad* gate, autograd::AccumulateGrad* up, DType dtype,
                          bool gate_first) {
  if (gate == nullptr || up == nullptr) return Tensor();
  const Tensor gate_grad = gate->gradient_storage(dtype), up_grad = up->gradient_storage(dtype);
  if (!gate_grad.defined() || !up_grad.defined() || gate_grad.storage() != up_grad.storage() ||
      gate->gradient_storage_counts_as_zero() != up->gradient_storage_counts_as_zero()) {
    return Tensor();
  }
  const Tensor& first = gate_first ? gate_grad : up_grad;
  const Tensor& second = gate_first ? up_grad : gate_grad;
  if (second.offset() != first.offset() + first.numel()) return Tensor();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = first.storage();
  impl->offset = first.offset();
  impl->shape = {2, first.size(0), first.size(1)};
  impl->strides = {first.numel(), first.size(1), 1};
  impl->dtype = first.dtype();
  return Tensor(std::move(impl));
}

// Whether the gate's half of the pair gradient comes first: yes unless the up weight's .grad lies
// right before the gate's (as a gradient buffer lays them, in backward order).
bool gate_gradient_first(autograd::AccumulateGrad* gate, autograd::AccumulateGrad* up, DType dtype) {
  return !adjacent_gradients(gate, up, dtype, /*gate_first=*/false).defined();
}

// The weight gradients from the pair gradient [2, R, H] (`gate_first`: half 0 is dG) and x's rows
// [R, C]: one batched product [2, H, R] @ [R, C] into both .grad when adjacent_gradients allows,
// otherwise one linear_parameter_gradients each. Returns dWg, dWu, undefined where added in place.
std::pair<Tensor, Tensor> weight_gradients(const Tensor& grad_pair, bool gate_first, const Tensor& rows,
                                           autograd::AccumulateGrad* gate, autograd::AccumulateGrad* up) {
  const Tensor both = adjacent_gradients(gate, up, grad_pair.dtype(), gate_first);
  if (both.defined()) {
    const double beta = gate->gradient_storage_counts_as_zero() ? 0.0 : 1.0;
    const Tensor shared_rows = rows.unsqueeze(0).expand({2, rows.size(0), rows.size(1)});  // batch stride 0
    backend_for(rows.device()).matmul(grad_pair.transpose(1, 2), shared_rows, both, 1.0, beta);
    gate->gradient_added_in_place();
    up->gradient_added_in_place();
    return {Tensor(), Tensor()};
  }
  const Tensor grad_gate = grad_pair.select(0, gate_first ? 0 : 1), grad_up = grad_pair.select(0, gate_first ? 1 : 0);
  return {linear_parameter_gradients(grad_gate, rows, false, gate).weight,
          linear_parameter_gradients(grad_up, rows, false, up).weight};
}

class SwigluLinearFunction final : public autograd::Function, public SwigluGradientProducer {
 public:
  std::string name() const override { return "SwigluLinearBackward"; }

  // The down-projection's dX product writes the pair gradient (swiglu_gradient_handoff.h), in the
  // order the weights' .grad lie, as this backward would allocate it.
  Handoff take_gradients_from_next_product(DType dtype, int64_t rows, int64_t hidden) override {
    if (saved_released() || saved().size() != 4) return {};
    const Tensor& pair = saved()[3];  // [2, R, H]
    if (!pair.defined() || pair.dtype() != dtype || pair.size(1) != rows || pair.size(2) != hidden) return {};
    const std::shared_ptr<autograd::AccumulateGrad> gate = autograd::leaf_accumulator(next_edges[1]);
    const std::shared_ptr<autograd::AccumulateGrad> up = autograd::leaf_accumulator(next_edges[2]);
    handed_gate_first_ = gate_gradient_first(gate.get(), up.get(), dtype);
    handed_pair_ = Tensor::empty({2, rows, hidden}, dtype, pair.device());
    return {pair.select(0, 0), pair.select(0, 1), handed_pair_.select(0, handed_gate_first_ ? 0 : 1),
            handed_pair_.select(0, handed_gate_first_ ? 1 : 0)};
  }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    const Tensor& gate_weight = inputs[1];  // [H, C]
    const Tensor& up_weight = inputs[2];    // [H, C]
    const int64_t hidden = gate_weight.size(0);
    x_shape_ = x.shape();
    const Tensor rows = x.reshape({-1, x.size(-1)});  // [R, C]
    const int64_t r = rows.size(0);
    Tensor pair = Tensor::empty({2, r, hidden}, x.dtype(), x.device());  // [gate; up] pre-activations
    Tensor out = Tensor::empty({r, hidden}, x.dtype(), x.device());
    backend_for(x.device()).swiglu_products(rows, gate_weight, up_weight, pair.select(0, 0), pair.select(0, 1), out);
    save_for_backward({rows, gate_weight, up_weight, pair});
    Shape out_shape = x_shape_;
    out_shape.back() = hidden;
    return {out.view(out_shape)};
  }

  // The output again from the saved pre-activations: the forward's kernel on the same values.
  bool can_rebuild_output(int) const override { return true; }
  Tensor rebuild_output(int) const override {
    const Tensor& pair = saved()[3];
    Tensor out = Tensor::empty({pair.size(1), pair.size(2)}, pair.dtype(), pair.device());
    backend_for(out.device()).swiglu(pair.select(0, 0), pair.select(0, 1), out);
    return out.view(output_shapes[0]);
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& rows = saved()[0];         // [R, C]
    const Tensor& gate_weight = saved()[1];  // [H, C]
    const Tensor& up_weight = saved()[2];    // [H, C]
    const Tensor& pair = saved()[3];         // [2, R, H]
    const int64_t r = rows.size(0), c = rows.size(1), hidden = gate_weight.size(0);
    Backend& backend = backend_for(rows.device());

    std::shared_ptr<autograd::AccumulateGrad> gate = autograd::leaf_accumulator(next_edges[1]);
    std::shared_ptr<autograd::AccumulateGrad> up = autograd::leaf_accumulator(next_edges[2]);
    // The pair gradient in the order of the weights' .grad, so that one product can write both:
    // handed over by the next linear's product, or computed here from the output's gradient.
    Tensor grad_pair;
    bool gate_first;
    if (handed_pair_.defined()) {
      grad_pair = std::move(handed_pair_);
      handed_pair_ = Tensor();
      gate_first = handed_gate_first_;
    } else {
      const Tensor g = grad_or_zeros(grads, 0).reshape({r, hidden}).contiguous();
      gate_first = gate_gradient_first(gate.get(), up.get(), g.dtype());
      grad_pair = Tensor::empty({2, r, hidden}, g.dtype(), g.device());
      backend.swiglu_backward(pair.select(0, 0), pair.select(0, 1), g, grad_pair.select(0, gate_first ? 0 : 1),
                              grad_pair.select(0, gate_first ? 1 : 0));
    }
    const Tensor grad_gate = grad_pair.select(0, gate_first ? 0 : 1), grad_up = grad_pair.select(0, gate_first ? 1 : 0);

    // dX = dG Wg + dU Wu: the first product adds what x's gradient already holds (as linear does),
    // the second adds into the first's result.
    Tensor grad_x = Tensor::empty({1, r, c}, grad_pair.dtype(), grad_pair.device());
    const Tensor addend =
        autograd::take_pending_gradient(next_edges[0], grad_pair.dtype(), r * c, grad_pair.device());
    if (addend.defined()) {
      backend.matmul_bias_add(grad_gate.unsqueeze(0), gate_weight.unsqueeze(0), Tensor(), addend.view({1, r, c}),
                              grad_x);
    } else {
      backend.matmul(grad_gate.unsqueeze(0), gate_weight.unsqueeze(0), grad_x, 1.0, 0.0);
    }
    backend.matmul(grad_up.unsqueeze(0), up_weight.unsqueeze(0), grad_x, 1.0, 1.0);

    if (autograd::DeferredWeightGradients* deferred = autograd::current_weight_gradient_deferral()) {
      if (gate != nullptr && up != nullptr) {
        // Captured by value: the engine frees this node's saved tensors after backward.
        deferred->add([grad_pair, gate_first, rows, gate, up] {
          auto [gate_gradient, up_gradient] = weight_gradients(grad_pair, gate_first, rows, gate.get(), up.get());
          // Accumulates a returned gradient, or fires the hooks of one added in place.
          gate->run_backward({gate_gradient});
          up->run_backward({up_gradient});
        });
        return {grad_x.view(x_shape_), Tensor(), Tensor()};
      }
    }
    auto [gate_gradient, up_gradient] = weight_gradients(grad_pair, gate_first, rows, gate.get(), up.get());
    return {grad_x.view(x_shape_), gate_gradient, up_gradient};
  }

 private:
  Shape x_shape_;
  // Set by take_gradients_from_next_product, taken by the next backward: the pair gradient written
  // by the down-projection's product, and which half is the gate's.
  Tensor handed_pair_;
  bool handed_gate_first_ = true;
};

}  // namespace

Tensor swiglu_linear(const Tensor& x, const Tensor& gate_weight, const Tensor& up_weight) {
  constexpr std::string_view kOp = "swiglu_linear";
  ops::check_floating(kOp, x, "input");
  ops::check_floating(kOp, gate_weight, "gate weight");
  ops::check_floating(kOp, up_weight, "up weight");
  ops::check_compatible(kOp, x, "input", gate_weight, "gate weight");
  ops::check_compatible(kOp, x, "input", up_weight, "up weight");
  ops::check_rank(kOp, gate_weight, "gate weight", 2);
  WEFT_CHECK(up_weight.shape() == gate_weight.shape(), "swiglu_linear: the gate weight ", gate_weight.describe(),
             " and the up weight ", up_weight.describe(), " must have one shape [hidden, C]");
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == gate_weight.size(1), "swiglu_linear: input ", x.describe(),
             " does not match the weights ", gate_weight.describe(), " (expected last dim ", gate_weight.size(1), ")");
  return autograd::apply<SwigluLinearFunction>({x, gate_weight, up_weight})[0];
}

}  // namespace weft
