// Differentiable matmul and linear (see matmul.h).
#include "runtime/ops/matmul.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/reduction.h"

namespace weft {
namespace {

// a [..., M, K] @ b [..., K, N] with no history. A 2-D b is shared by every row of a, so the whole
// product is one [rows, K] x [K, N] GEMM; otherwise batch dims are broadcast and flattened.
Tensor product(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (b.dim() == 2) {
    Shape out_shape = a.shape();
    out_shape.back() = n;
    const Tensor rows = a.dim() == 2 ? a : a.reshape({-1, k});
    Tensor out = Tensor::empty({1, rows.size(0), n}, a.dtype(), a.device());
    backend_for(a.device()).matmul(rows.unsqueeze(0), b.unsqueeze(0), out, 1.0, 0.0);
    return out.view(out_shape);
  }
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  const int64_t batch_count = shape_numel(batch);
  Shape a_full = batch, b_full = batch, out_shape = batch;
  a_full.insert(a_full.end(), {m, k});
  b_full.insert(b_full.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = Tensor::empty({batch_count, m, n}, a.dtype(), a.device());
  backend_for(a.device()).matmul(a.expand(a_full).reshape({batch_count, m, k}),
                                 b.expand(b_full).reshape({batch_count, k, n}), out, 1.0, 0.0);
  return out.view(out_shape);
}

class MatmulFunction final : public autograd::Function {
 public:
  std::string name() const override { return "MatmulBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    save_for_backward({inputs[0], inputs[1]});
    return {product(inputs[0], inputs[1])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& a = saved()[0];
    const Tensor& b = saved()[1];
    const Tensor& g = grads[0];  // [..., M, N]
    // dA = dC B^T, dB = A^T dC; transposes are views that BLAS reads in place.
    Tensor grad_a = sum_to_shape(product(g, b.transpose(-1, -2)), a.shape());
    Tensor grad_b;
    if (b.dim() == 2) {
      const int64_t k = a.size(-1), n = g.size(-1);
      grad_b = product(a.reshape({-1, k}).transpose(0, 1), g.reshape({-1, n}));
    } else {
      grad_b = sum_to_shape(product(a.transpose(-1, -2), g), b.shape());
    }
    return {grad_a, grad_b};
  }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  ops::check_floating("matmul", a, "a");
  ops::check_floating("matmul", b, "b");
  ops::check_compatible("matmul", a, "a", b, "b");
  WEFT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: operands need at least 2 dims, got a ", a.describe(), " and b ",
             b.describe(), " (use unsqueeze for vectors)");
  WEFT_CHECK(a.size(-1) == b.size(-2), "matmul: inner dims differ: a ", a.describe(), " has K = ", a.size(-1),
             " but b ", b.describe(), " has K = ", b.size(-2));
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  try {
    broadcast_shapes(a_batch, b_batch, "matmul");
  } catch (const Error&) {
    WEFT_FAIL("matmul: the batch dims of a ", a.describe(), " and b ", b.describe(), " cannot be broadcast together");
  }
  return autograd::apply<MatmulFunction>({a, b})[0];
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ops::check_floating("linear", x, "input");
  ops::check_floating("linear", weight, "weight");
  ops::check_compatible("linear", x, "input", weight, "weight");
  ops::check_rank("linear", weight, "weight", 2);
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.describe(),
             " does not match weight ", weight.describe(), " (expected last dim ", weight.size(1), ")");
  const Tensor rows = x.dim() == 1 ? x.unsqueeze(0) : x;
  Tensor out = matmul(rows, weight.transpose(0, 1));
  if (bias.defined()) {
    ops::check_compatible("linear", x, "input", bias, "bias");
    ops::check_shape("linear", bias, "bias", {weight.size(0)});
    out = add(out, bias);
  }
  return x.dim() == 1 ? out.squeeze(0) : out;
}

}  // namespace weft
