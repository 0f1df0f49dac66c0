// Differentiable embedding lookup (see embedding.h).
#include "runtime/ops/embedding.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

class EmbeddingFunction final : public autograd::Function {
 public:
  std::string name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor ids = inputs[0].contiguous();
    const Tensor weight = inputs[1].contiguous();
    Shape out_shape = ids.shape();
    out_shape.push_back(weight.size(1));
    Tensor out = Tensor::empty({ids.numel(), weight.size(1)}, weight.dtype(), weight.device());
    backend_for(weight.device()).embedding(ids.view({-1}), weight, out);
    save_for_backward({ids});
    weight_shape_ = weight.shape();
    return {out.view(out_shape)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& ids = saved()[0];
    const Tensor& g = grads[0];
    Tensor grad_weight = Tensor::zeros(weight_shape_, g.dtype(), g.device());
    backend_for(g.device()).embedding_backward(ids.view({-1}), g.contiguous().view({-1, weight_shape_[1]}),
                                               grad_weight);
    return {Tensor(), grad_weight};
  }

 private:
  Shape weight_shape_;
};

}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  ops::check_index("embedding", ids, "ids");
  ops::check_floating("embedding", weight, "weight");
  ops::check_rank("embedding", weight, "weight", 2);
  WEFT_CHECK(ids.device() == weight.device(), "embedding: ids ", ids.describe(), " and weight ", weight.describe(),
             " are on different devices");
  return autograd::apply<EmbeddingFunction>({ids, weight})[0];
}

}  // namespace weft
