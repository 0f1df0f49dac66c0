// Differentiable layer norm and RMS norm (see normalization.h).
#include "runtime/ops/normalization.h"

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/bias_gradient_handoff.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

// [..., C] as [rows, C].
Tensor as_rows(const Tensor& x) { return x.contiguous().view({-1, x.size(-1)}); }

// Where a norm's backward writes its gradients, and what it folds in (Backend's NormBackwardExtras):
// - the gradient its input x already has from the engine (taken, autograd::take_pending_gradient:
//   the residual stream's, deposited by the block's later ops), added into grad_x in the kernel
//   instead of by the engine's separate add afterwards;
// - the parameters' .grad itself (AccumulateGrad::gradient_storage) when every parameter edge leads
//   straight to a leaf that offers one, accumulated into by the kernel: no new [C] gradients and
//   no adds. Those edges then return undefined gradients (gradient_added_in_place). Where both
//   count as zero (the gradient buffer's lazy zeroing), the kernel writes them instead of adding;
// - the bias gradient of the linear that produced x (bias_gradient_handoff.h), the column sums of
//   grad_x, where grad_x is all that the linear's output receives and the backend sums them in the
//   pass that writes grad_x.
struct NormGradientTargets {
  NormBackwardExtras extras;
  bool in_place = false;  // grad_weight and grad_bias are the parameters' .grad storage
  Tensor grad_weight, grad_bias;  // [C]: the .grad storage or new tensors
  std::vector<std::shared_ptr<autograd::AccumulateGrad>> accumulators;  // those added into in place

  // x: the saved input rows [N, C]; x_edge, weight_edge, bias_edge: the node's edges for them
  // (bias_edge null without a bias).
  NormGradientTargets(const Tensor& x, const Tensor& weight, const autograd::Edge& x_edge,
                      const autograd::Edge& weight_edge, const autograd::Edge* bias_edge) {
    extras.grad_x_addend = autograd::take_pending_gradient(x_edge, x.dtype(), x.numel(), x.device());
    if (extras.grad_x_addend.defined()) extras.grad_x_addend = extras.grad_x_addend.view(x.shape());
    // After the take: receives_only_this_gradient needs the slot empty.
    offer_grad_x_column_sums(x, x_edge);
    const auto storage = [&](const autograd::Edge& edge, std::shared_ptr<autograd::AccumulateGrad>& accumulator) {
      accumulator = autograd::leaf_accumulator(edge);
      return accumulator != nullptr ? accumulator->gradient_storage(weight.dtype()) : Tensor();
    };
    std::shared_ptr<autograd::AccumulateGrad> weight_accumulator, bias_accumulator;
    const Tensor weight_storage = storage(weight_edge, weight_accumulator);
    const Tensor bias_storage = bias_edge != nullptr ? storage(*bias_edge, bias_accumulator) : Tensor();
    in_place = weight_storage.defined() && (bias_edge == nullptr || bias_storage.defined());
    if (in_place) {
      grad_weight = weight_storage;
      grad_bias = bias_storage;
      accumulators.push_back(weight_accumulator);
      if (bias_accumulator != nullptr) accumulators.push_back(bias_accumulator);
      bool all_count_as_zero = true;
      for (const auto& accumulator : accumulators) {
        all_count_as_zero = all_count_as_zero && accumulator->gradient_storage_counts_as_zero();
      }
      // One mode for both: where only one counts as zero, its zeros are written first.
      if (!all_count_as_zero) {
        for (const auto& accumulator : accumulators) accumulator->write_counted_zeros();
      }
      extras.accumulate_parameter_gradients = !all_count_as_zero;
    } else {
      grad_weight = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
      if (bias_edge != nullptr) grad_bias = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
    }
  }

  // Asks the node at `producer_edge` (that produced x, or a tensor whose gradient is grad_x) whether
  // it takes grad_x's column sums as its bias gradient (bias_gradient_handoff.h); where it does,
  // extras.grad_x_column_sums is the tensor to write them into. Only one producer is asked per
  // backward: the first that agrees. Where x is a model segment's input, the node asked is the
  // previous segment's output's producer (autograd::gradient_destination).
  void offer_grad_x_column_sums(const Tensor& x, const autograd::Edge& producer_edge) {
    if (extras.grad_x_column_sums.defined()) return;
    if (auto* taker = dynamic_cast<BiasGradientTaker*>(autograd::gradient_destination(producer_edge).node.get());
        taker != nullptr && backend_for(x.device()).norm_backward_sums_columns_in_pass(x) &&
        autograd::receives_only_this_gradient(producer_edge)) {
      extras.grad_x_column_sums = taker->take_bias_gradient_from_output_gradient(x.dtype(), x.size(1));
    }
  }

  // After the kernel: tells the accumulators written in place, and gives the gradients to return
  // for weight and bias (undefined for those written in place).
  std::pair<Tensor, Tensor> returned_parameter_gradients() const {
    for (const auto& accumulator : accumulators) accumulator->gradient_added_in_place();
    if (in_place) return {Tensor(), Tensor()};
    return {grad_weight, grad_bias};
  }
};

class LayerNormFunction final : public autograd::Function {
 public:
  explicit LayerNormFunction(double eps) : eps_(eps) {}
  std::string name() const override { return "LayerNormBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = as_rows(inputs[0]);
    const Tensor weight = inputs[1].contiguous();
    const Tensor& bias = inputs[2];
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor mean = Tensor::empty({x.size(0)}, statistic_dtype(x.dtype()), x.device());
    Tensor rstd = Tensor::empty({x.size(0)}, statistic_dtype(x.dtype()), x.device());
    backend_for(x.device()).layer_norm(x, weight, bias.defined() ? bias.contiguous() : Tensor(), eps_, out, mean,
                                       rstd);
    save_for_backward({x, weight, mean, rstd});
    has_bias_ = bias.defined();
    return {out.view(inputs[0].shape())};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& x = saved()[0];
    const Tensor& weight = saved()[1];
    Tensor grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
    const NormGradientTargets targets(x, weight, next_edges[0], next_edges[1], has_bias_ ? &next_edges[2] : nullptr);
    backend_for(x.device()).layer_norm_backward(x, weight, saved()[2], saved()[3], as_rows(grads[0]), grad_x,
                                                targets.grad_weight, targets.grad_bias, targets.extras);
    const auto [grad_weight, grad_bias] = targets.returned_parameter_gradients();
    return {grad_x.view(output_shapes[0]), grad_weight, grad_bias};
  }

 private:
  double eps_;
  bool has_bias_ = false;
};

class RmsNormFunction final : public autograd::Function {
 public:
  explicit RmsNormFunction(double eps) : eps_(eps) {}
  std::string name() const override { return "RmsNormBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = as_rows(inputs[0]);
    const Tensor weight = inputs[1].contiguous();
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor rstd = Tensor::empty({x.size(0)}, statistic_dtype(x.dtype()), x.device());
    backend_for(x.device()).rms_norm(x, weight, eps_, out, rstd);
    save_for_backward({x, weight, rstd});
    return {out.view(inputs[0].shape())};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& x = saved()[0];
    const Tensor& weight = saved()[1];
    Tensor grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
    const NormGradientTargets targets(x, weight, next_edges[0], next_edges[1], nullptr);
    backend_for(x.device()).rms_norm_backward(x, weight, saved()[2], as_rows(grads[0]), grad_x, targets.grad_weight,
                                              targets.extras);
    return {grad_x.view(output_shapes[0]), targets.returned_parameter_gradients().first};
  }

 private:
  double eps_;
};

// The gradient of a fused residual add and norm (AddLayerNormFunction, AddRmsNormFunction): both
// outputs' gradients meet at the sum, d sum = grad_sum + the norm's input gradient, which flows to x
// and residual alike. The norm's backward computes it in one pass, with grad_sum as its addend (and
// its parameters' gradients as NormGradientTargets says); without a gradient for the normalized
// output, d sum is grad_sum.
template <class RunNormBackward>
std::vector<Tensor> add_norm_backward(const autograd::Function& function, const std::vector<Tensor>& grads,
                                      const Tensor& sum, const Tensor& weight, bool has_bias,
                                      const RunNormBackward& run_norm_backward) {
  const std::vector<autograd::Edge>& edges = function.next_edges;
  const autograd::Edge* bias_edge = has_bias ? &edges[3] : nullptr;
  std::vector<Tensor> gradients(edges.size());
  Tensor grad_sum;
  if (grads[1].defined()) {
    grad_sum = Tensor::empty(sum.shape(), sum.dtype(), sum.device());
    NormGradientTargets targets(sum, weight, autograd::Edge(), edges[2], bias_edge);
    // d sum is all that x and residual receive from here: the producer of either (GPT's attention
    // output projection is the residual's) may take its column sums as its bias gradient.
    targets.offer_grad_x_column_sums(sum, edges[1]);
    targets.offer_grad_x_column_sums(sum, edges[0]);
    // The kernels read the addend in the sum's dtype (to() is the tensor itself when it already is).
    if (grads[0].defined()) targets.extras.grad_x_addend = as_rows(grads[0]).to(sum.dtype());
    run_norm_backward(as_rows(grads[1]), grad_sum, targets);
    const auto [grad_weight, grad_bias] = targets.returned_parameter_gradients();
    gradients[2] = grad_weight;
    if (has_bias) gradients[3] = grad_bias;
  } else {
    // (The engine runs a backward only when some gradient arrived, so grads[0] is there; zeros
    // keep a direct call safe.)
    grad_sum = grads[0].defined() ? grads[0].contiguous().view(sum.shape())
                                  : Tensor::zeros(sum.shape(), sum.dtype(), sum.device());
  }
  const Tensor grad = grad_sum.view(function.output_shapes[0]);
  gradients[0] = grad;
  gradients[1] = grad;
  return gradients;
}

// sum = x + residual and out = layer_norm(sum) from one backend call; saves the sum (not x and
// residual) with the statistics, so the backward is layer_norm's on the sum.
class AddLayerNormFunction final : public autograd::Function {
 public:
  explicit AddLayerNormFunction(double eps) : eps_(eps) {}
  std::string name() const override { return "AddLayerNormBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = as_rows(inputs[0]);
    const Tensor residual = as_rows(inputs[1]);
    const Tensor weight = inputs[2].contiguous();
    const Tensor& bias = inputs[3];
    Tensor sum = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor mean = Tensor::empty({x.size(0)}, statistic_dtype(x.dtype()), x.device());
    Tensor rstd = Tensor::empty({x.size(0)}, statistic_dtype(x.dtype()), x.device());
    backend_for(x.device()).add_layer_norm(x, residual, weight, bias.defined() ? bias.contiguous() : Tensor(), eps_,
                                           sum, out, mean, rstd);
    save_for_backward({sum, weight, mean, rstd});
    has_bias_ = bias.defined();
    return {sum.view(inputs[0].shape()), out.view(inputs[0].shape())};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& sum = saved()[0];
    const Tensor& weight = saved()[1];
    return add_norm_backward(*this, grads, sum, weight, has_bias_,
                             [&](const Tensor& grad_out, const Tensor& grad_sum, const NormGradientTargets& targets) {
                               backend_for(sum.device()).layer_norm_backward(
                                   sum, weight, saved()[2], saved()[3], grad_out, grad_sum, targets.grad_weight,
                                   targets.grad_bias, targets.extras);
                             });
  }

 private:
  double eps_;
  bool has_bias_ = false;
};

// sum = x + residual and out = rms_norm(sum) from one backend call, as AddLayerNormFunction.
class AddRmsNormFunction final : public autograd::Function {
 public:
  explicit AddRmsNormFunction(double eps) : eps_(eps) {}
  std::string name() const override { return "AddRmsNormBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = as_rows(inputs[0]);
    const Tensor residual = as_rows(inputs[1]);
    const Tensor weight = inputs[2].contiguous();
    Tensor sum = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor rstd = Tensor::empty({x.size(0)}, statistic_dtype(x.dtype()), x.device());
    backend_for(x.device()).add_rms_norm(x, residual, weight, eps_, sum, out, rstd);
    save_for_backward({sum, weight, rstd});
    return {sum.view(inputs[0].shape()), out.view(inputs[0].shape())};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& sum = saved()[0];
    const Tensor& weight = saved()[1];
    return add_norm_backward(*this, grads, sum, weight, false,
                             [&](const Tensor& grad_out, const Tensor& grad_sum, const NormGradientTargets& targets) {
                               backend_for(sum.device()).rms_norm_backward(sum, weight, saved()[2], grad_out,
                                                                           grad_sum, targets.grad_weight,
                                                                           targets.extras);
                             });
  }

 private:
  double eps_;
};

void check_norm_arguments(std::string_view op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                          double eps) {
  ops::check_floating(op, x, "x");
  WEFT_CHECK(x.dim() >= 1, op, ": x must have at least one dim, got ", x.describe());
  ops::check_compatible(op, x, "x", weight, "weight");
  ops::check_shape(op, weight, "weight", {x.size(-1)});
  if (bias.defined()) {
    ops::check_compatible(op, x, "x", bias, "bias");
    ops::check_shape(op, bias, "bias", {x.size(-1)});
  }
  WEFT_CHECK(eps > 0, op, ": eps must be positive, got ", eps);
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_norm_arguments("layer_norm", x, weight, bias, eps);
  return autograd::apply<LayerNormFunction>({x, weight, bias}, eps)[0];
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                         const Tensor& bias, double eps) {
  check_norm_arguments("add_layer_norm", x, weight, bias, eps);
  ops::check_compatible("add_layer_norm", x, "x", residual, "residual");
  WEFT_CHECK(residual.shape() == x.shape(), "add_layer_norm: residual ", residual.describe(),
             " must have the shape of x ", x.describe());
  std::vector<Tensor> outputs = autograd::apply<AddLayerNormFunction>({x, residual, weight, bias}, eps);
  return {outputs[0], outputs[1]};
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_arguments("rms_norm", x, weight, Tensor(), eps);
  return autograd::apply<RmsNormFunction>({x, weight}, eps)[0];
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  check_norm_arguments("add_rms_norm", x, weight, Tensor(), eps);
  ops::check_compatible("add_rms_norm", x, "x", residual, "residual");
  WEFT_CHECK(residual.shape() == x.shape(), "add_rms_norm: residual ", residual.describe(),
             " must have the shape of x ", x.describe());
  std::vector<Tensor> outputs = autograd::apply<AddRmsNormFunction>({x, residual, weight}, eps);
  return {outputs[0], outputs[1]};
}

}  // namespace weft
