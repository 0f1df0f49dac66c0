#include "runtime/autograd/function.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"

namespace weft::autograd {

std::vector<Tensor> Function::run_backward(std::vector<Tensor> grad_outputs) {
  WEFT_CHECK(!released_, name(), ": backward through a graph whose saved tensors were already freed; "
             "pass retain_graph=true to the first backward() to run backward twice");
  return backward(grad_outputs);
}

void Function::release_saved() {
  saved_.clear();
  released_ = true;
}

void Function::save_for_backward(std::vector<Tensor> tensors) {
  saved_.clear();
  for (const Tensor& tensor : tensors) saved_.push_back(tensor.defined() ? tensor.detach() : Tensor());
}

const std::vector<Tensor>& Function::saved() const { return saved_; }

Tensor Function::rebuild_output(int index) const {
  WEFT_FAIL(name(), ": cannot compute its output ", index, " again (can_rebuild_output is false)");
}

Tensor Function::grad_or_zeros(const std::vector<Tensor>& grad_outputs, int index) const {
  if (grad_outputs[index].defined()) return grad_outputs[index];
  return Tensor::zeros(output_shapes[index], output_dtypes[index], output_devices[index]);
}

std::vector<Tensor> apply_function(const std::shared_ptr<Function>& function, const std::vector<Tensor>& inputs) {
  const bool record = any_requires_grad(inputs);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = function->forward(inputs);
  }
  if (!record) return outputs;
  connect(*function, inputs);
  function->set_num_outputs(static_cast<int>(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& output = outputs[i];
    WEFT_CHECK(output.defined(), function->name(), ": forward returned an undefined output ", i);
    function->output_shapes.push_back(output.shape());
    function->output_dtypes.push_back(output.dtype());
    function->output_devices.push_back(output.device());
    if (!is_floating(output.dtype())) continue;
    // An output that is one of the inputs (or already has history) gets its own handle, so the
    // input's history is not overwritten.
    bool aliases_input = output.impl()->autograd != nullptr;
    for (const Tensor& input : inputs) aliases_input |= input.defined() && input.is_same(output);
    if (aliases_input) output = output.detach();
    set_history(output, function, static_cast<int>(i));
  }
  return outputs;
}

}  // namespace weft::autograd
