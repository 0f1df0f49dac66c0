// Custom differentiable ops: forward and backward written together in one class.
//
// Subclass Function, keep whatever the backward needs as members (save tensors with
// save_for_backward, which stores them detached), and call it through apply():
//
//   class ScaleFunction : public weft::autograd::Function {
//    public:
//     explicit ScaleFunction(double factor) : factor_(factor) {}
//     std::string name() const override { return "ScaleBackward"; }
//     std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
//       return {inputs[0] * factor_};
//     }
//     std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
//       return {grads[0] * factor_};
//     }
//    private:
//     double factor_;
//   };
//   Tensor y = weft::autograd::apply<ScaleFunction>({x}, 2.0)[0];
//
// forward runs with grad mode off. backward receives one gradient per output (undefined where no
// gradient arrived; call grad_or_zeros to get zeros instead) and returns one per input (undefined
// for inputs without a gradient, such as integer ids). Integer outputs never carry history.
// Every built-in op in runtime/ops/ is written this way.
//
// An op whose saved tensors determine an output may also say how to compute that output again
// (can_rebuild_output / rebuild_output): train.recompute selective frees a large activation that a
// later op saved and refills it in backward from what its producer kept anyway
// (recompute.h's output_rebuilder and release_until_backward).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "runtime/autograd/node.h"

namespace weft::autograd {

class Function : public Node {
 public:
  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs) = 0;
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) = 0;

  std::vector<Tensor> run_backward(std::vector<Tensor> grad_outputs) final;
  void release_saved() override;

  // Whether rebuild_output(index) can compute output `index` again from the saved tensors.
  virtual bool can_rebuild_output(int index) const { return false; }
  // Output `index` computed again (called with grad mode off, before this node's backward has
  // freed its saved tensors): the same values as forward returned, up to the rounding of fused
  // epilogues (an op may say which), as a new tensor of the output's shape and dtype.
  virtual Tensor rebuild_output(int index) const;
  // Whether the saved tensors were freed (this node's backward ran without retain_graph).
  bool saved_released() const { return released_; }

 protected:
  // Keeps detached aliases of `tensors` for the backward.
  void save_for_backward(std::vector<Tensor> tensors);
  const std::vector<Tensor>& saved() const;
  // The gradient of output `index`, or zeros of that output's shape when none arrived.
  Tensor grad_or_zeros(const std::vector<Tensor>& grad_outputs, int index) const;

 private:
  std::vector<Tensor> saved_;
  bool released_ = false;
};

// Runs `function`'s forward on `inputs` and, when grad mode is on and an input requires grad, links
// its outputs into the graph.
std::vector<Tensor> apply_function(const std::shared_ptr<Function>& function, const std::vector<Tensor>& inputs);

template <class FunctionType, class... Arguments>
std::vector<Tensor> apply(const std::vector<Tensor>& inputs, Arguments&&... arguments) {
  return apply_function(std::make_shared<FunctionType>(std::forward<Arguments>(arguments)...), inputs);
}

}  // namespace weft::autograd
