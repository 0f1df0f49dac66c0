// Differentiable elementwise ops (see elementwise.h) and Tensor's arithmetic operators.
#include "runtime/ops/elementwise.h"

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/reduction.h"

namespace weft {
namespace {

std::string_view binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "sub";
    case BinaryOp::kMul: return "mul";
    case BinaryOp::kDiv: return "div";
  }
  return "binary";
}

Tensor run_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& shape) {
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  backend_for(a.device()).binary(op, a.expand(shape), b.expand(shape), out);
  return out;
}

class BinaryFunction final : public autograd::Function {
 public:
  explicit BinaryFunction(BinaryOp op) : op_(op) {}
  std::string name() const override { return str(binary_name(op_), "Backward"); }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& a = inputs[0];
    const Tensor& b = inputs[1];
    a_shape_ = a.shape();
    b_shape_ = b.shape();
    const Shape shape = broadcast_shapes(a.shape(), b.shape(), binary_name(op_));
    if (op_ == BinaryOp::kMul || op_ == BinaryOp::kDiv) save_for_backward({a, b});
    return {run_binary(op_, a, b, shape)};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const Shape& shape = g.shape();
    Tensor grad_a, grad_b;
    switch (op_) {
      case BinaryOp::kAdd:
        grad_a = g;
        grad_b = g;
        break;
      case BinaryOp::kSub:
        grad_a = g;
        grad_b = neg(g);
        break;
      case BinaryOp::kMul:
        grad_a = run_binary(BinaryOp::kMul, g, saved()[1], shape);
        grad_b = run_binary(BinaryOp::kMul, g, saved()[0], shape);
        break;
      case BinaryOp::kDiv: {
        // d(a/b)/da = 1/b; d(a/b)/db = -a/b^2.
        const Tensor& a = saved()[0];
        const Tensor& b = saved()[1];
        grad_a = run_binary(BinaryOp::kDiv, g, b, shape);
        Tensor quotient = run_binary(BinaryOp::kDiv, grad_a, b, shape);
        grad_b = neg(run_binary(BinaryOp::kMul, quotient, a, shape));
        break;
      }
    }
    return {sum_to_shape(grad_a, a_shape_), sum_to_shape(grad_b, b_shape_)};
  }

 private:
  BinaryOp op_;
  Shape a_shape_, b_shape_;
};

class UnaryFunction final : public autograd::Function {
 public:
  UnaryFunction(UnaryOp op, std::string_view name) : op_(op), name_(name) {}
  std::string name() const override { return str(name_, "Backward"); }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    save_for_backward({x});
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).unary(op_, x, out);
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& x = saved()[0];
    Tensor grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).unary_backward(op_, x, grads[0], grad_x);
    return {grad_x};
  }
  // The output again from the saved input: the same op on the same values, bitwise.
  bool can_rebuild_output(int) const override { return true; }
  Tensor rebuild_output(int) const override {
    const Tensor& x = saved()[0];
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).unary(op_, x, out);
    return out;
  }

 private:
  UnaryOp op_;
  std::string_view name_;
};

class AffineFunction final : public autograd::Function {
 public:
  AffineFunction(double scale, double shift) : scale_(scale), shift_(shift) {}
  std::string name() const override { return "AffineBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).affine(x, scale_, shift_, out);
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor grad_x = Tensor::empty(g.shape(), g.dtype(), g.device());
    backend_for(g.device()).affine(g, scale_, 0.0, grad_x);
    return {grad_x};
  }

 private:
  double scale_, shift_;
};

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const std::string_view name = binary_name(op);
  ops::check_floating(name, a, "a");
  ops::check_floating(name, b, "b");
  ops::check_compatible(name, a, "a", b, "b");
  broadcast_shapes(a.shape(), b.shape(), name);  // fails early with both shapes named
  return autograd::apply<BinaryFunction>({a, b}, op)[0];
}

Tensor unary(UnaryOp op, std::string_view name, const Tensor& x) {
  ops::check_floating(name, x, "x");
  return autograd::apply<UnaryFunction>({x}, op, name)[0];
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kMul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kDiv, a, b); }

Tensor scale(const Tensor& x, double factor) {
  ops::check_floating("scale", x, "x");
  return autograd::apply<AffineFunction>({x}, factor, 0.0)[0];
}

Tensor add_scalar(const Tensor& x, double value) {
  ops::check_floating("add_scalar", x, "x");
  return autograd::apply<AffineFunction>({x}, 1.0, value)[0];
}

Tensor neg(const Tensor& x) { return scale(x, -1.0); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::kRelu, "relu", x); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::kGelu, "gelu", x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::kSilu, "silu", x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::kExp, "exp", x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::kLog, "log", x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::kTanh, "tanh", x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::kSqrt, "sqrt", x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::kSquare, "square", x); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator*(const Tensor& a, double factor) { return scale(a, factor); }
Tensor operator*(double factor, const Tensor& a) { return scale(a, factor); }
Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace weft
