// Differentiable causal self-attention (see attention.h).
#include "runtime/ops/attention.h"

#include <cmath>

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

class AttentionFunction final : public autograd::Function {
 public:
  explicit AttentionFunction(double scale) : scale_(scale) {}
  std::string name() const override { return "CausalAttentionBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor q = inputs[0].contiguous(), k = inputs[1].contiguous(), v = inputs[2].contiguous();
    Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
    Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, statistic_dtype(q.dtype()),
                               q.device());
    backend_for(q.device()).attention(q, k, v, scale_, out, lse);
    save_for_backward({q, k, v, out, lse});
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const std::vector<Tensor>& s = saved();
    Tensor grad_q = Tensor::empty(s[0].shape(), s[0].dtype(), s[0].device());
    Tensor grad_k = Tensor::empty(s[0].shape(), s[0].dtype(), s[0].device());
    Tensor grad_v = Tensor::empty(s[0].shape(), s[0].dtype(), s[0].device());
    backend_for(s[0].device()).attention_backward(s[0], s[1], s[2], s[3], s[4], grads[0].contiguous(), scale_, grad_q,
                                                  grad_k, grad_v);
    return {grad_q, grad_k, grad_v};
  }

 private:
  double scale_;
};

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  ops::check_floating("causal_attention", q, "q");
  ops::check_rank("causal_attention", q, "q", 4);
  ops::check_compatible("causal_attention", q, "q", k, "k");
  ops::check_compatible("causal_attention", q, "q", v, "v");
  ops::check_shape("causal_attention", k, "k", q.shape());
  ops::check_shape("causal_attention", v, "v", q.shape());
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  return autograd::apply<AttentionFunction>({q, k, v}, scale)[0];
}

}  // namespace weft
