// Differentiable SwiGLU activation (swiglu.h).
#include "runtime/ops/swiglu.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

class SwigluFunction final : public autograd::Function {
 public:
  std::string name() const override { return "SwigluBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor gate = inputs[0].contiguous(), up = inputs[1].contiguous();
    Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    backend_for(gate.device()).swiglu(gate, up, out);
    save_for_backward({gate, up});
    return {out};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& gate = saved()[0];
    const Tensor& up = saved()[1];
    Tensor grad_gate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    Tensor grad_up = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    backend_for(gate.device()).swiglu_backward(gate, up, grads[0].contiguous(), grad_gate, grad_up);
    return {grad_gate, grad_up};
  }
  // The output again from the saved gate and up: the same kernel on the same values, bitwise.
  bool can_rebuild_output(int) const override { return true; }
  Tensor rebuild_output(int) const override {
    const Tensor& gate = saved()[0];
    Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    backend_for(gate.device()).swiglu(gate, saved()[1], out);
    return out;
  }
};

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  constexpr std::string_view kOp = "swiglu";
  ops::check_floating(kOp, gate, "gate");
  ops::check_floating(kOp, up, "up");
  ops::check_compatible(kOp, gate, "gate", up, "up");
  WEFT_CHECK(gate.shape() == up.shape(), "swiglu: gate ", gate.describe(), " and up ", up.describe(),
             " must have one shape (both are the MLP's hidden activations; no broadcasting)");
  return autograd::apply<SwigluFunction>({gate, up})[0];
}

}  // namespace weft
