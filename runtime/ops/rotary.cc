// Differentiable rotary position embedding (rotary.h).
#include "runtime/ops/rotary.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

Tensor with_unit_row_stride(const Tensor& tensor) {
  return tensor.size(3) <= 1 || tensor.stride(3) == 1 ? tensor : tensor.contiguous();
}

// An uninitialized [B, H, T, D] tensor whose memory is [B, T, H, D] when heads_inner, else
// [B, H, T, D].
Tensor empty_heads(const Shape& shape, bool heads_inner, DType dtype, Device device) {
  if (!heads_inner) return Tensor::empty(shape, dtype, device);
  return Tensor::empty({shape[0], shape[2], shape[1], shape[3]}, dtype, device).permute({0, 2, 1, 3});
}

class RotaryEmbeddingFunction final : public autograd::Function {
 public:
  RotaryEmbeddingFunction(Tensor cos, Tensor sin) : cos_(std::move(cos)), sin_(std::move(sin)) {}
  std::string name() const override { return "RotaryEmbeddingBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = with_unit_row_stride(inputs[0]);
    // Heads inner to positions in memory: the layer's q and k, views of one [B, T, ...] projection.
    heads_inner_ = x.stride(1) < x.stride(2);
    Tensor out = empty_heads(x.shape(), heads_inner_, x.dtype(), x.device());
    backend_for(x.device()).rotary_embedding(x, cos_, sin_, out);
    return {out};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    if (gradient_unrotated_) {  // the consumer already applied the transpose (unrotate_gradient_in_place)
      gradient_unrotated_ = false;
      return {grads[0]};
    }
    const Tensor grad = with_unit_row_stride(grads[0]);
    Tensor grad_x = empty_heads(grad.shape(), heads_inner_, grad.dtype(), grad.device());
    backend_for(grad.device()).rotary_embedding_backward(grad, cos_, sin_, grad_x);
    return {grad_x};
  }

  // unrotate_gradient_in_place's work, for this node's output gradient `grad`.
  bool unrotate_in_place(const Tensor& grad) {
    if (output_uses(0) != 1 || grad.dim() != 4 || (grad.size(3) > 1 && grad.stride(3) != 1) ||
        grad.shape() != output_shapes[0] || grad.dtype() != cos_.dtype() || grad.device() != cos_.device()) {
      return false;
    }
    // In place: each pair (i, i + D/2) of a row is read whole before it is written, on the CPU and
    // on CUDA (one thread a pair), so grad_x may be grad_out.
    backend_for(grad.device()).rotary_embedding_backward(grad, cos_, sin_, grad);
    gradient_unrotated_ = true;
    return true;
  }

 private:
  Tensor cos_, sin_;  // [T, D] contiguous, constants
  bool heads_inner_ = false;
  // Set by the consumer (unrotate_in_place): the gradient arriving is the input's already.
  bool gradient_unrotated_ = false;
};

}  // namespace

bool unrotate_gradient_in_place(const autograd::Edge& edge, const Tensor& grad) {
  if (!edge.valid() || edge.input_index != 0) return false;
  const auto rotary = std::dynamic_pointer_cast<RotaryEmbeddingFunction>(edge.node);
  return rotary != nullptr && rotary->unrotate_in_place(grad);
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  constexpr std::string_view kOp = "rotary_embedding";
  ops::check_floating(kOp, x, "x");
  WEFT_CHECK(x.dim() == 4, "rotary_embedding: x must be [B, H, T, D], got ", x.describe());
  const int64_t time = x.size(2), head_dim = x.size(3);
  WEFT_CHECK(head_dim % 2 == 0, "rotary_embedding: the head dim D must be even (pairs (i, i + D/2) rotate), got ",
             x.describe());
  ops::check_compatible(kOp, x, "x", cos, "cos");
  ops::check_compatible(kOp, x, "x", sin, "sin");
  WEFT_CHECK(cos.dim() == 2 && cos.size(0) == time && cos.size(1) == head_dim && sin.shape() == cos.shape(),
             "rotary_embedding: cos ", cos.describe(), " and sin ", sin.describe(), " must be [T, D] = [", time, ", ",
             head_dim, "] for x ", x.describe(), " (narrow the tables to the sequence's positions)");
  WEFT_CHECK(!cos.requires_grad() && !sin.requires_grad(),
             "rotary_embedding: cos and sin are constant tables and get no gradient, but one of them requires grad "
             "(pass tables built by rotary_tables, or detach() them)");
  return autograd::apply<RotaryEmbeddingFunction>({x}, cos.contiguous(), sin.contiguous())[0];
}

}  // namespace weft
