// Differentiable reductions (see reduction.h).
#include "runtime/ops/reduction.h"

#include <algorithm>

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

// Sorted, unique, non-negative dims; all dims when `dims` is empty.
Shape normalize_dims(absl::Span<const int64_t> dims, absl::Span<const int64_t> shape, std::string_view op) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  Shape result;
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) result.push_back(d);
    return result;
  }
  for (int64_t d : dims) result.push_back(normalize_dim(d, shape, op));
  std::sort(result.begin(), result.end());
  WEFT_CHECK(std::adjacent_find(result.begin(), result.end()) == result.end(), op, ": dims ",
             shape_string(dims), " repeat a dim");
  return result;
}

Shape kept_shape(const Shape& shape, const Shape& dims) {
  Shape out = shape;
  for (int64_t d : dims) out[d] = 1;
  return out;
}

Shape dropped_shape(const Shape& shape, const Shape& dims) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) out.push_back(shape[d]);
  }
  return out;
}

class SumFunction final : public autograd::Function {
 public:
  SumFunction(Shape dims, bool keepdim, bool mean) : dims_(std::move(dims)), keepdim_(keepdim), mean_(mean) {}
  std::string name() const override { return mean_ ? "MeanBackward" : "SumBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    input_shape_ = x.shape();
    const Shape kept = kept_shape(x.shape(), dims_);
    Tensor out = Tensor::empty(kept, x.dtype(), x.device());
    backend_for(x.device()).reduce(mean_ ? ReduceOp::kMean : ReduceOp::kSum, x, dims_, out, Tensor());
    return {keepdim_ ? out : out.view(dropped_shape(x.shape(), dims_))};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor g = grads[0].reshape(kept_shape(input_shape_, dims_));
    if (mean_) {
      int64_t count = 1;
      for (int64_t d : dims_) count *= input_shape_[d];
      g = scale(g, count > 0 ? 1.0 / static_cast<double>(count) : 0.0);
    }
    return {g.expand(input_shape_).contiguous()};
  }

 private:
  Shape dims_;
  bool keepdim_;
  bool mean_;
  Shape input_shape_;
};

class MaxFunction final : public autograd::Function {
 public:
  MaxFunction(int64_t dim, bool keepdim) : dim_(dim), keepdim_(keepdim) {}
  std::string name() const override { return "MaxBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    input_shape_ = x.shape();
    const Shape dims{dim_};
    const Shape kept = kept_shape(x.shape(), dims);
    Tensor values = Tensor::empty(kept, x.dtype(), x.device());
    Tensor indices = Tensor::empty(kept, kInt64, x.device());
    backend_for(x.device()).reduce(ReduceOp::kMax, x, dims, values, indices);
    save_for_backward({indices});
    if (keepdim_) return {values, indices};
    const Shape dropped = dropped_shape(x.shape(), dims);
    return {values.view(dropped), indices.view(dropped)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    // Scatter each gradient to the position of its maximum (on the host: a reference op; device
    // backends do not need max for training).
    const Tensor indices = saved()[0].to(Device::cpu());
    Tensor g = grad_or_zeros(grads, 0);
    const Device device = g.device();
    g = g.reshape(indices.shape()).to(Device::cpu()).contiguous();
    Tensor grad_x = Tensor::zeros(input_shape_, g.dtype(), Device::cpu());
    // Move the reduced dim last so each output slot's row is contiguous.
    const int64_t rank = static_cast<int64_t>(input_shape_.size());
    Tensor moved = grad_x.transpose(dim_, rank - 1);
    Tensor index_moved = indices.transpose(dim_, rank - 1).contiguous();
    Tensor grad_moved = g.transpose(dim_, rank - 1).contiguous();
    const std::vector<double> gradient_values = grad_moved.to_vector();
    const int64_t rows = index_moved.numel();
    Shape row_shape(moved.shape().begin(), moved.shape().end() - 1);
    for (int64_t row = 0; row < rows; ++row) {
      Shape position(row_shape.size());
      int64_t rest = row;
      for (int64_t d = static_cast<int64_t>(row_shape.size()) - 1; d >= 0; --d) {
        position[d] = rest % row_shape[d];
        rest /= row_shape[d];
      }
      position.push_back(index_moved.data<int64_t>()[row]);
      moved.set(position, moved.at(position) + gradient_values[row]);
    }
    return {grad_x.to(device)};
  }

 private:
  int64_t dim_;
  bool keepdim_;
  Shape input_shape_;
};

}  // namespace

Tensor sum(const Tensor& x, absl::Span<const int64_t> dims, bool keepdim) {
  ops::check_floating("sum", x, "x");
  return autograd::apply<SumFunction>({x}, normalize_dims(dims, x.shape(), "sum"), keepdim, false)[0];
}

Tensor mean(const Tensor& x, absl::Span<const int64_t> dims, bool keepdim) {
  ops::check_floating("mean", x, "x");
  return autograd::apply<SumFunction>({x}, normalize_dims(dims, x.shape(), "mean"), keepdim, true)[0];
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  ops::check_floating("max", x, "x");
  dim = normalize_dim(dim, x.shape(), "max");
  WEFT_CHECK(x.size(dim) > 0, "max: dim ", dim, " of ", x.describe(), " is empty");
  std::vector<Tensor> outputs = autograd::apply<MaxFunction>({x}, dim, keepdim);
  return {outputs[0], outputs[1]};
}

Tensor sum_to_shape(const Tensor& x, absl::Span<const int64_t> shape) {
  if (absl::Span<const int64_t>(x.shape()) == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  WEFT_CHECK(lead >= 0, "sum_to_shape: cannot sum ", x.describe(), " to ", shape_string(shape));
  Shape dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  }
  Shape kept = x.shape();
  for (int64_t d : dims) kept[d] = 1;
  Tensor out = Tensor::empty(kept, x.dtype(), x.device());
  if (!dims.empty()) {
    backend_for(x.device()).reduce(ReduceOp::kSum, x, dims, out, Tensor());
  } else {
    out.copy_(x);
  }
  return out.view(shape);
}

}  // namespace weft
