// squared_relu: Primer's activation, y = scale * relu(x)^2, as a custom differentiable op.
//
// Written the way every op in runtime/ops/ is: one autograd::Function subclass holding the forward
// and its hand-derived backward,
//   forward:  y  = scale * r^2,        r = relu(x)
//   backward: dx = dy * 2 * scale * r  (r is 0 where x <= 0, so the kink needs no special case)
// The forward saves r, not x: it is all the backward needs. Both passes are written with weft's
// tensor ops (under grad mode off, as Function::forward always runs), so the op works for every
// dtype and device the runtime has without a kernel of its own.
#pragma once

#include <string>
#include <vector>

#include "runtime/autograd/function.h"
#include "runtime/tensor.h"

namespace weft_example {

class SquaredReluFunction : public weft::autograd::Function {
 public:
  explicit SquaredReluFunction(double scale) : scale_(scale) {}
  std::string name() const override { return "SquaredReluBackward"; }
  // inputs: {x [...]}; returns {y [...]}, same shape and dtype.
  std::vector<weft::Tensor> forward(const std::vector<weft::Tensor>& inputs) override;
  // grad_outputs: {dy [...]}; returns {dx [...]}.
  std::vector<weft::Tensor> backward(const std::vector<weft::Tensor>& grad_outputs) override;

 private:
  double scale_;
};

// scale * relu(x)^2, differentiable through SquaredReluFunction.
weft::Tensor squared_relu(const weft::Tensor& x, double scale = 1.0);

}  // namespace weft_example
