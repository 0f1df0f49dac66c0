// Differentiable matmul and linear (see matmul.h).
#include "runtime/ops/matmul.h"

#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/bias_gradient_handoff.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/linear_parameter_gradients.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/reduction.h"
#include "runtime/ops/swiglu_gradient_handoff.h"

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
    if (b.dim() == 2 && b.size(0) > 1 && b.size(1) > 1 && b.stride(0) == 1 && b.stride(1) == b.size(0)) {
      // b is the transpose of a contiguous [N, K] matrix (a linear layer's weight.transpose(0, 1)):
      // compute dB^T = dC^T A as a contiguous [N, K] product and hand back its transpose, so that the
      // weight's gradient arrives contiguous (no transposed copy when it is accumulated).
      const int64_t k = a.size(-1), n = g.size(-1);
      grad_b = product(g.reshape({-1, n}).transpose(0, 1), a.reshape({-1, k})).transpose(0, 1);
    } else if (b.dim() == 2) {
      const int64_t k = a.size(-1), n = g.size(-1);
      grad_b = product(a.reshape({-1, k}).transpose(0, 1), g.reshape({-1, n}));
    } else {
      grad_b = sum_to_shape(product(a.transpose(-1, -2), g), b.shape());
    }
    return {grad_a, grad_b};
  }
};

// A linear layer's input x [..., K] as rows [R, K] (a view where x allows), and its output's shape
// [..., N] for weight [N, K].
struct LinearRows {
  Tensor rows;
  Shape out_shape;
};

LinearRows linear_rows(const Tensor& x, const Tensor& weight) {
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  return {x.reshape({-1, x.size(-1)}), out_shape};
}

// linear with a bias as one product with the bias fused (Backend::matmul_bias), or with `gelu`
// gelu(linear(...)) from one Backend::matmul_bias_gelu call, which also writes the pre-activation,
// or with `residual` (a fourth input, [..., N]) residual + linear(...) from one
// Backend::matmul_bias_add call; the residual's gradient is dY itself.
// Backward: with gelu, dPre = gelu'(pre) * dY (Backend::unary_backward) first, unless the linear
// after it (an MLP's projection, the one use of this output) already handed it dPre from its own
// dX GEMM with gelu' in the epilogue (Backend::matmul_gelu_backward); then dX = dY W now (or, where
// the input is a SwiGLU op's output with this linear its one use, that op's gate and up gradients
// from one Backend::matmul_swiglu_backward: swiglu_gradient_handoff.h),
// and dW, db now or, under a DeferWeightGradients with a leaf weight (and a leaf bias or one without
// a gradient), later: the work goes to the deferral target and dW, db are returned undefined, so the
// engine leaves the parameters' AccumulateGrad alone until DeferredWeightGradients::run() (a
// target of BiasGradients::kWithInputGradients still takes db now, as below, and its work item hands
// it on). Without a deferral, db comes with dX's product (Backend::matmul_and_column_sums: the
// same sums, which a backend may take from the product's own read of dY), unless dX folds in a
// pending gradient, or unless the op that wrote dY summed its columns already
// (bias_gradient_handoff.h: a norm's backward writing the residual stream's gradient).
class LinearFunction final : public autograd::Function, public BiasGradientTaker {
 public:
  explicit LinearFunction(bool gelu, bool residual = false) : gelu_(gelu), residual_(residual) {}
  std::string name() const override {
    return gelu_ ? "LinearGeluBackward" : residual_ ? "LinearAddBackward" : "LinearBackward";
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    const Tensor& weight = inputs[1];  // [N, K]
    const Tensor& bias = inputs[2];    // [N], or undefined (no bias; not with gelu)
    const int64_t n = weight.size(0);
    x_shape_ = x.shape();
    with_bias_ = bias.defined();
    const auto [rows, out_shape] = linear_rows(x, weight);  // [R, K], [..., N]
    if (residual_) {
      const Tensor residual = inputs[3].contiguous();  // [..., N]
      Tensor out = Tensor::empty({1, rows.size(0), n}, x.dtype(), x.device());
      backend_for(x.device()).matmul_bias_add(rows.unsqueeze(0), weight.transpose(0, 1).unsqueeze(0),
                                              with_bias_ ? bias.contiguous() : Tensor(),
                                              residual.view({1, rows.size(0), n}), out);
      save_for_backward({rows, weight});
      return {out.view(out_shape)};
    }
    if (!with_bias_) {
      // The product matmul(x, weight^T) makes, the same GEMM; as a linear, its weight gradient can
      // be deferred (zero-bubble pipelines).
      save_for_backward({rows, weight});
      return {product(rows, weight.transpose(0, 1)).view(out_shape)};
    }
    Tensor out = Tensor::empty({1, rows.size(0), n}, x.dtype(), x.device());
    const Tensor a = rows.unsqueeze(0), b = weight.transpose(0, 1).unsqueeze(0);
    if (gelu_) {
      Tensor pre_activation = Tensor::empty({1, rows.size(0), n}, x.dtype(), x.device());
      backend_for(x.device()).matmul_bias_gelu(a, b, bias.contiguous(), out, pre_activation);
      save_for_backward({rows, weight, pre_activation.view({rows.size(0), n})});
    } else {
      backend_for(x.device()).matmul_bias(a, b, bias.contiguous(), out);
      save_for_backward({rows, weight});
    }
    return {out.view(out_shape)};
  }
  // With gelu, the output again from the saved pre-activation: gelu of the rounded pre-activation
  // (Backend::unary), which is what the CPU's forward computes; CUDA's forward epilogue applies GELU
  // to the f32 sum before rounding, so there a rebuilt value may differ from the forward's in its
  // last bit.
  bool can_rebuild_output(int) const override { return gelu_; }
  Tensor rebuild_output(int) const override {
    const Tensor& pre_activation = saved()[2];  // [R, N]
    Tensor out = Tensor::empty(pre_activation.shape(), pre_activation.dtype(), pre_activation.device());
    backend_for(out.device()).unary(UnaryOp::kGelu, pre_activation, out);
    return out.view(output_shapes[0]);
  }
  // Agrees where backward would take the bias gradient with dX (see bias_with_input_gradient there).
  Tensor take_bias_gradient_from_output_gradient(DType dtype, int64_t columns) override {
    if (gelu_ || !with_bias_ || !next_edges[2].valid() || saved().empty() || saved()[1].size(0) != columns ||
        autograd::bias_gradients_deferred()) {
      return Tensor();
    }
    handed_bias_gradient_ = Tensor::empty({columns}, dtype, saved()[1].device());
    bias_gradient_handoff_count.fetch_add(1, std::memory_order_relaxed);
    return handed_bias_gradient_;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& rows = saved()[0];    // [R, K]
    const Tensor& weight = saved()[1];  // [N, K]
    const int64_t n = weight.size(0);
    Tensor g = grad_or_zeros(grads, 0).reshape({-1, n});  // [R, N]
    // The bias gradient summed by the op that wrote g (take_bias_gradient_from_output_gradient).
    Tensor bias_gradient = std::move(handed_bias_gradient_);  // [N], or taken with dX below
    handed_bias_gradient_ = Tensor();
    if (gelu_ && !handed_pre_activation_gradient_) {
      const Tensor& pre_activation = saved()[2];  // [R, N]
      Tensor grad_pre = Tensor::empty(pre_activation.shape(), pre_activation.dtype(), pre_activation.device());
      backend_for(g.device()).unary_backward(UnaryOp::kGelu, pre_activation, g, grad_pre);
      g = grad_pre;
    }
    handed_pre_activation_gradient_ = false;
    // The bias gradient (the column sums of g) with dX's product where nothing defers it: the
    // backend may take it from the product's own read of g (Backend::matmul_and_column_sums).
    const bool bias_with_input_gradient = with_bias_ && next_edges[2].valid() && g.is_contiguous() &&
                                          !autograd::bias_gradients_deferred() &&
                                          !bias_gradient.defined();
    Tensor grad_x;
    if (const std::shared_ptr<LinearFunction> producer = gelu_producer()) {
      // dX here is the GELU linear's dY; it gets its dPre = gelu'(pre) * (dY W) from one GEMM instead.
      const Tensor& pre_activation = producer->saved()[2];  // [R, K]
      grad_x = Tensor::empty({1, pre_activation.size(0), pre_activation.size(1)}, g.dtype(), g.device());
      if (bias_with_input_gradient) {
        bias_gradient = Tensor::empty({n}, g.dtype(), g.device());
        backend_for(g.device()).matmul_and_column_sums(g.unsqueeze(0), weight.unsqueeze(0),
                                                       pre_activation.unsqueeze(0), grad_x, bias_gradient);
      } else {
        backend_for(g.device()).matmul_gelu_backward(g.unsqueeze(0), weight.unsqueeze(0),
                                                     pre_activation.unsqueeze(0), grad_x);
      }
      producer->handed_pre_activation_gradient_ = true;
      grad_x = grad_x.view(x_shape_);
    } else if (const SwigluGradientProducer::Handoff handoff = swiglu_handoff(g.dtype()); handoff.gate.defined()) {
      // dX here is the gradient of a SwiGLU output; its producer takes its gate and up gradients from
      // this product instead (swiglu_gradient_handoff.h). What flows on to it stands in for dX, of
      // its shape; the producer's backward does not read it.
      backend_for(g.device()).matmul_swiglu_backward(g.unsqueeze(0), weight.unsqueeze(0), handoff.gate, handoff.up,
                                                     handoff.grad_gate, handoff.grad_up);
      grad_x = handoff.grad_gate.view(x_shape_);
    } else {
      grad_x = input_gradient(g, weight, rows.size(1), bias_with_input_gradient ? &bias_gradient : nullptr);
    }
    autograd::DeferredWeightGradients* deferred = autograd::current_weight_gradient_deferral();
    if (deferred != nullptr) {
      std::shared_ptr<autograd::AccumulateGrad> weight_accumulator = autograd::leaf_accumulator(next_edges[1]);
      std::shared_ptr<autograd::AccumulateGrad> bias_accumulator = autograd::leaf_accumulator(next_edges[2]);
      // A weight that is not a leaf (a converted or gathered copy) must pass its gradient on through
      // the graph now, and so must a bias that is not a leaf; the layer's parameter gradients are
      // then all computed now, as without a deferral, rather than split between B and W.
      if (weight_accumulator != nullptr && (bias_accumulator != nullptr || !next_edges[2].valid())) {
        // g and rows are captured by value: the engine frees this node's saved tensors after backward.
        // A bias gradient handed over before the deferral began (the op after this linear was in a
        // walk without one: bias_gradient_handoff.h) waits with the weight's.
        deferred->add([g, rows, weight_accumulator, bias_accumulator, bias_gradient] {
          LinearParameterGradients gradients = linear_parameter_gradients(
              g, rows, bias_accumulator != nullptr && !bias_gradient.defined(), weight_accumulator.get());
          if (bias_gradient.defined()) gradients.bias = bias_gradient;
          // Accumulates a returned dW, or fires the hooks of one added in place.
          weight_accumulator->run_backward({gradients.weight});
          if (bias_accumulator != nullptr) bias_accumulator->run_backward({gradients.bias});
        });
        return with_residual_gradient({grad_x, Tensor(), Tensor()}, grads);
      }
    }
    const std::shared_ptr<autograd::AccumulateGrad> weight_accumulator = autograd::leaf_accumulator(next_edges[1]);
    LinearParameterGradients gradients =
        linear_parameter_gradients(g, rows, with_bias_ && !bias_gradient.defined(), weight_accumulator.get());
    if (bias_gradient.defined()) gradients.bias = bias_gradient;
    return with_residual_gradient({grad_x, gradients.weight, gradients.bias}, grads);
  }

 private:
  // The GELU linear whose output is this linear's input, when this linear is that output's one use
  // (Node::output_uses: no other gradient is summed with what this backward hands it) and its
  // pre-activation is still saved; else null. This backward then hands it dPre, not dY.
  std::shared_ptr<LinearFunction> gelu_producer() const {
    const autograd::Edge& input = next_edges[0];
    if (!input.valid() || input.input_index != 0) return nullptr;
    std::shared_ptr<LinearFunction> producer = std::dynamic_pointer_cast<LinearFunction>(input.node);
    if (producer == nullptr || !producer->gelu_ || producer->output_uses(0) != 1 || producer->saved().size() != 3) {
      return nullptr;
    }
    const Tensor& pre_activation = producer->saved()[2];  // [R, K]
    return pre_activation.dtype() == saved()[0].dtype() && pre_activation.size(0) == saved()[0].size(0) &&
                   pre_activation.size(1) == saved()[0].size(1)
               ? producer
               : nullptr;
  }

  // Where this linear's input is a SwiGLU op's output and this linear its one use: the producer's
  // buffers for its gate and up gradients, which this backward's product then writes
  // (swiglu_gradient_handoff.h); otherwise undefined members.
  SwigluGradientProducer::Handoff swiglu_handoff(DType dtype) const {
    const autograd::Edge& input = next_edges[0];
    if (!input.valid() || input.input_index != 0 || input.node->output_uses(0) != 1) return {};
    auto* producer = dynamic_cast<SwigluGradientProducer*>(input.node.get());
    if (producer == nullptr) return {};
    return producer->take_gradients_from_next_product(dtype, saved()[0].size(0), saved()[0].size(1));
  }

  // dX = dY W ([R, K], as x_shape_), plus the gradient x already has from its other uses when that
  // arrived first (autograd::take_pending_gradient: Llama's gate and up projections read the same
  // normalized rows): then one Backend::matmul_bias_add, where CUDA's GEMM reads it as C and adds
  // it before rounding once, instead of a product and the engine's separate add (the CPU reference
  // computes the product and the add as the engine would). With bias_gradient (not null) and no such
  // gradient, also the bias gradient, the column sums of g, into *bias_gradient
  // (Backend::matmul_and_column_sums); with one, *bias_gradient is left undefined.
  Tensor input_gradient(const Tensor& g, const Tensor& weight, int64_t k, Tensor* bias_gradient) const {
    const int64_t r = g.size(0);
    const Tensor addend = autograd::take_pending_gradient(next_edges[0], g.dtype(), r * k, g.device());
    if (!addend.defined() && bias_gradient != nullptr) {
      Tensor grad_x = Tensor::empty({1, r, k}, g.dtype(), g.device());
      *bias_gradient = Tensor::empty({g.size(1)}, g.dtype(), g.device());
      backend_for(g.device()).matmul_and_column_sums(g.unsqueeze(0), weight.unsqueeze(0), Tensor(), grad_x,
                                                     *bias_gradient);
      return grad_x.view(x_shape_);
    }
    if (!addend.defined()) return product(g, weight).view(x_shape_);
    Tensor grad_x = Tensor::empty({1, r, k}, g.dtype(), g.device());
    backend_for(g.device()).matmul_bias_add(g.unsqueeze(0), weight.unsqueeze(0), Tensor(), addend.view({1, r, k}),
                                            grad_x);
    return grad_x.view(x_shape_);
  }

  // The gradients of x, weight and bias, and with a residual its gradient: the output's, as it came.
  std::vector<Tensor> with_residual_gradient(std::vector<Tensor> gradients, const std::vector<Tensor>& grads) const {
    if (residual_) gradients.push_back(grad_or_zeros(grads, 0));
    return gradients;
  }

  bool gelu_;
  bool residual_;
  bool with_bias_ = true;
  Shape x_shape_;
  // Set by the linear after this one (gelu_producer): the gradient arriving is already dPre.
  bool handed_pre_activation_gradient_ = false;
  // [N]: the bias gradient, written by the op that wrote the gradient arriving (the norm after this
  // linear: take_bias_gradient_from_output_gradient); undefined otherwise.
  Tensor handed_bias_gradient_;
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

namespace {

void check_linear_arguments(std::string_view op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ops::check_floating(op, x, "input");
  ops::check_floating(op, weight, "weight");
  ops::check_compatible(op, x, "input", weight, "weight");
  ops::check_rank(op, weight, "weight", 2);
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, ": input ", x.describe(),
             " does not match weight ", weight.describe(), " (expected last dim ", weight.size(1), ")");
  if (bias.defined()) {
    ops::check_compatible(op, x, "input", bias, "bias");
    ops::check_shape(op, bias, "bias", {weight.size(0)});
  }
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear_arguments("linear", x, weight, bias);
  const Tensor rows = x.dim() == 1 ? x.unsqueeze(0) : x;
  const Tensor out = autograd::apply<LinearFunction>({rows, weight, bias}, false)[0];
  return x.dim() == 1 ? out.squeeze(0) : out;
}

Tensor linear_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual) {
  check_linear_arguments("linear_add", x, weight, bias);
  ops::check_compatible("linear_add", x, "input", residual, "residual");
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  WEFT_CHECK(residual.shape() == out_shape, "linear_add: residual ", residual.describe(),
             " must have the output's shape ", shape_string(out_shape), " (input ", x.describe(), ", weight ",
             weight.describe(), ")");
  if (x.dim() == 1) {
    return autograd::apply<LinearFunction>({x.unsqueeze(0), weight, bias, residual.unsqueeze(0)}, false, true)[0]
        .squeeze(0);
  }
  return autograd::apply<LinearFunction>({x, weight, bias, residual}, false, true)[0];
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear_arguments("linear_gelu", x, weight, bias);
  if (!bias.defined()) return gelu(linear(x, weight));
  const Tensor rows = x.dim() == 1 ? x.unsqueeze(0) : x;
  const Tensor out = autograd::apply<LinearFunction>({rows, weight, bias}, true)[0];
  return x.dim() == 1 ? out.squeeze(0) : out;
}

}  // namespace weft
