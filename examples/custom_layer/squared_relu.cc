// SquaredReluFunction (squared_relu.h).
#include "squared_relu.h"

#include "runtime/ops/elementwise.h"

namespace weft_example {

std::vector<weft::Tensor> SquaredReluFunction::forward(const std::vector<weft::Tensor>& inputs) {
  const weft::Tensor rectified = weft::relu(inputs[0]);  // r [...]
  save_for_backward({rectified});
  return {weft::scale(weft::mul(rectified, rectified), scale_)};
}

std::vector<weft::Tensor> SquaredReluFunction::backward(const std::vector<weft::Tensor>& grad_outputs) {
  const weft::Tensor& rectified = saved()[0];  // r [...]
  return {weft::mul(grad_outputs[0], weft::scale(rectified, 2.0 * scale_))};
}

weft::Tensor squared_relu(const weft::Tensor& x, double scale) {
  return weft::autograd::apply<SquaredReluFunction>({x}, scale)[0];
}

}  // namespace weft_example
