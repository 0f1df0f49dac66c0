// Differentiable dropout (see dropout.h).
#include "runtime/ops/dropout.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

class DropoutFunction final : public autograd::Function {
 public:
  DropoutFunction(double p, uint64_t seed, uint64_t offset) : p_(p), seed_(seed), offset_(offset) {}
  std::string name() const override { return "DropoutBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {apply_mask(inputs[0])}; }
  // The same mask (same seed and offset) applied to the gradient.
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override { return {apply_mask(grads[0])}; }

 private:
  Tensor apply_mask(const Tensor& tensor) const {
    const Tensor x = tensor.contiguous();
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).dropout(x, p_, seed_, offset_, out);
    return out;
  }
  double p_;
  uint64_t seed_, offset_;
};

}  // namespace

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training) {
  ops::check_floating("dropout", x, "x");
  WEFT_CHECK(p >= 0.0 && p < 1.0, "dropout: probability ", p, " must be in [0, 1)");
  if (!training || p == 0.0) return x;
  return autograd::apply<DropoutFunction>({x}, p, seed, offset)[0];
}

}  // namespace weft
