// Differentiable softmax and log-softmax (see softmax.h). The kernels work on the last dim of a
// contiguous tensor; another dim is moved last and back.
#include "runtime/ops/softmax.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

class SoftmaxFunction final : public autograd::Function {
 public:
  explicit SoftmaxFunction(bool log) : log_(log) {}
  std::string name() const override { return log_ ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = inputs[0].contiguous();
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).softmax(x, y, log_);
    save_for_backward({y});
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& y = saved()[0];
    Tensor grad_x = Tensor::empty(y.shape(), y.dtype(), y.device());
    backend_for(y.device()).softmax_backward(y, grads[0].contiguous(), grad_x, log_);
    return {grad_x};
  }

 private:
  bool log_;
};

Tensor softmax_along(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  ops::check_floating(op, x, "x");
  if (x.dim() == 0) return autograd::apply<SoftmaxFunction>({x.view({1})}, log)[0].view({});
  dim = normalize_dim(dim, x.shape(), op);
  const int64_t last = x.dim() - 1;
  if (dim == last) return autograd::apply<SoftmaxFunction>({x}, log)[0];
  return autograd::apply<SoftmaxFunction>({x.transpose(dim, last)}, log)[0].transpose(dim, last);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, true); }

}  // namespace weft
