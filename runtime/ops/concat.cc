// Differentiable concat and split (see concat.h).
#include "runtime/ops/concat.h"

#include "runtime/autograd/function.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"

namespace weft {
namespace {

class ConcatFunction final : public autograd::Function {
 public:
  explicit ConcatFunction(int64_t dim) : dim_(dim) {}
  std::string name() const override { return "ConcatBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    Shape shape = inputs[0].shape();
    shape[dim_] = 0;
    for (const Tensor& input : inputs) {
      shape[dim_] += input.size(dim_);
      sizes_.push_back(input.size(dim_));
    }
    Tensor out = Tensor::empty(shape, inputs[0].dtype(), inputs[0].device());
    int64_t start = 0;
    for (const Tensor& input : inputs) {
      out.narrow(dim_, start, input.size(dim_)).copy_(input);
      start += input.size(dim_);
    }
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    std::vector<Tensor> result;
    int64_t start = 0;
    for (int64_t size : sizes_) {
      result.push_back(grads[0].narrow(dim_, start, size));
      start += size;
    }
    return result;
  }

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

// The pieces' gradients as one tensor of `shape` without a copy, when they already lie in one
// storage exactly where the pieces of such a tensor would (an op that wrote its gradients into one
// buffer: attention's backward writes dq, dk, dv into one [B, T, H + 2KV, D] buffer, whose pieces
// reach here as views of it); else undefined.
Tensor joined_in_place(const std::vector<Tensor>& grads, const Shape& shape, int64_t dim, const Shape& sizes) {
  const Tensor& first = grads[0];
  if (!first.defined()) return Tensor();
  int64_t start = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& piece = grads[i];
    if (!piece.defined() || piece.storage() != first.storage() || piece.dtype() != first.dtype() ||
        piece.strides() != first.strides() || piece.offset() != first.offset() + start * first.stride(dim)) {
      return Tensor();
    }
    start += sizes[i];
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = first.storage();
  impl->offset = first.offset();
  impl->shape = shape;
  impl->strides = first.strides();
  impl->dtype = first.dtype();
  return Tensor(std::move(impl));
}

class SplitFunction final : public autograd::Function {
 public:
  SplitFunction(Shape sizes, int64_t dim) : sizes_(std::move(sizes)), dim_(dim) {}
  std::string name() const override { return "SplitBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    std::vector<Tensor> pieces;
    int64_t start = 0;
    for (int64_t size : sizes_) {
      pieces.push_back(inputs[0].narrow(dim_, start, size));
      start += size;
    }
    return pieces;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Shape shape = output_shapes[0];
    shape[dim_] = 0;
    for (int64_t size : sizes_) shape[dim_] += size;
    if (Tensor joined = joined_in_place(grads, shape, dim_, sizes_); joined.defined()) return {joined};
    Tensor grad = Tensor::empty(shape, output_dtypes[0], output_devices[0]);
    int64_t start = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      Tensor slot = grad.narrow(dim_, start, sizes_[i]);
      if (grads[i].defined()) {
        slot.copy_(grads[i]);
      } else {
        slot.zero_();
      }
      start += sizes_[i];
    }
    return {grad};
  }

 private:
  Shape sizes_;
  int64_t dim_;
};

}  // namespace

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  WEFT_CHECK(!tensors.empty(), "concat: no tensors given");
  const Tensor& first = tensors[0];
  ops::check_defined("concat", first, "tensor 0");
  dim = normalize_dim(dim, first.shape(), "concat");
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& other = tensors[i];
    ops::check_compatible("concat", first, "tensor 0", other, str("tensor ", i));
    WEFT_CHECK(other.dim() == first.dim(), "concat: tensor ", i, " ", other.describe(), " has a different rank than "
               "tensor 0 ", first.describe());
    for (int64_t d = 0; d < first.dim(); ++d) {
      WEFT_CHECK(d == dim || other.size(d) == first.size(d), "concat: tensor ", i, " ", other.describe(),
                 " differs from tensor 0 ", first.describe(), " in dim ", d, " (only dim ", dim, " may differ)");
    }
  }
  return autograd::apply<ConcatFunction>(tensors, dim)[0];
}

std::vector<Tensor> split(const Tensor& x, absl::Span<const int64_t> sizes, int64_t dim) {
  ops::check_defined("split", x, "x");
  dim = normalize_dim(dim, x.shape(), "split");
  int64_t total = 0;
  for (int64_t size : sizes) {
    WEFT_CHECK(size >= 0, "split: negative size in ", shape_string(sizes));
    total += size;
  }
  WEFT_CHECK(total == x.size(dim), "split: sizes ", shape_string(sizes), " add up to ", total, " but dim ", dim, " of ",
             x.describe(), " has ", x.size(dim));
  return autograd::apply<SplitFunction>({x}, Shape(sizes.begin(), sizes.end()), dim);
}

}  // namespace weft
