// Differentiable embedding lookup (see embedding.h).
#include "runtime/ops/embedding.h"

#include "runtime/autograd/function.h"
#include "runtime/autograd/node.h"
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
    const Tensor rows = grads[0].contiguous().view({-1, weight_shape_[1]});  // [count, C]
    Backend& backend = backend_for(rows.device());
    // The backend adds into what it is given. Where the weight's edge leads straight to a leaf that
    // offers its .grad (AccumulateGrad::gradient_storage), that is the .grad itself: no [V, C] tensor
    // of zeros made, scattered into and then added (for a tied weight, onto the output head's dW
    // already there). Zeros it counts as are written first: the scatter touches only named rows.
    const std::shared_ptr<autograd::AccumulateGrad> accumulator = autograd::leaf_accumulator(next_edges[1]);
    const Tensor storage = accumulator != nullptr ? accumulator->gradient_storage(rows.dtype()) : Tensor();
    if (storage.defined()) {
      accumulator->write_counted_zeros();
      backend.embedding_backward(ids.view({-1}), rows, storage);
      accumulator->gradient_added_in_place();
      return {Tensor(), Tensor()};
    }
    Tensor grad_weight = Tensor::zeros(weight_shape_, rows.dtype(), rows.device());
    backend.embedding_backward(ids.view({-1}), rows, grad_weight);
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
