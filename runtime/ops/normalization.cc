// Differentiable layer norm and RMS norm (see normalization.h).
#include "runtime/ops/normalization.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

// [..., C] as [rows, C].
Tensor as_rows(const Tensor& x) { return x.contiguous().view({-1, x.size(-1)}); }

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
    Tensor grad_weight = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
    Tensor grad_bias = has_bias_ ? Tensor::empty(weight.shape(), weight.dtype(), weight.device()) : Tensor();
    backend_for(x.device()).layer_norm_backward(x, weight, saved()[2], saved()[3], as_rows(grads[0]), grad_x,
                                                grad_weight, grad_bias);
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
    Tensor grad_weight = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
    backend_for(x.device()).rms_norm_backward(x, weight, saved()[2], as_rows(grads[0]), grad_x, grad_weight);
    return {grad_x.view(output_shapes[0]), grad_weight};
  }

 private:
  double eps_;
};

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
    Tensor grad_sum;
    Tensor grad_weight, grad_bias;
    if (grads[1].defined()) {
      grad_sum = Tensor::empty(sum.shape(), sum.dtype(), sum.device());
      grad_weight = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
      grad_bias = has_bias_ ? Tensor::empty(weight.shape(), weight.dtype(), weight.device()) : Tensor();
      Backend& backend = backend_for(sum.device());
      backend.layer_norm_backward(sum, weight, saved()[2], saved()[3], as_rows(grads[1]), grad_sum, grad_weight,
                                  grad_bias);
      if (grads[0].defined()) backend.binary(BinaryOp::kAdd, grad_sum, as_rows(grads[0]), grad_sum);
    } else {
      grad_sum = grad_or_zeros(grads, 0).contiguous().view(sum.shape());
    }
    const Tensor grad = grad_sum.view(output_shapes[0]);
    return {grad, grad, grad_weight, grad_bias};
  }

 private:
  double eps_;
  bool has_bias_ = false;
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

}  // namespace weft
