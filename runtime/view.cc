// The view methods of Tensor: new geometry over the same storage, with the backward that maps a
// gradient of the view back to the shape of its base.
#include <algorithm>
#include <numeric>

#include "runtime/autograd/function.h"
#include "runtime/error.h"
#include "runtime/ops/reduction.h"
#include "runtime/tensor.h"

namespace weft {
namespace {

Tensor make_view(const Tensor& base, Shape shape, Strides strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// Replaces a single -1 by the size that keeps numel; checks the element count.
Shape infer_shape(absl::Span<const int64_t> requested, int64_t numel, std::string_view op,
                  const Tensor& tensor) {
  Shape shape(requested.begin(), requested.end());
  int64_t known = 1;
  int inferred = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      WEFT_CHECK(inferred < 0, op, ": only one size may be -1 in ", shape_string(requested));
      inferred = static_cast<int>(d);
    } else {
      WEFT_CHECK(shape[d] >= 0, op, ": invalid size ", shape[d], " in ", shape_string(requested));
      known *= shape[d];
    }
  }
  if (inferred >= 0) {
    WEFT_CHECK(known != 0 && numel % known == 0, op, ": cannot view ", tensor.describe(), " as ",
               shape_string(requested));
    shape[inferred] = numel / known;
  }
  WEFT_CHECK(shape_numel(shape) == numel, op, ": shape ", shape_string(requested), " has ", shape_numel(shape),
             " elements but ", tensor.describe(), " has ", numel);
  return shape;
}

// Strides that let `tensor` be seen with `shape` without a copy, if any. Old dims are grouped into
// chunks that are contiguous with each other (each dim's stride is the next one's stride times its
// size); each chunk must map onto a run of new dims with the same element count, which then get
// row-major strides based on the chunk's innermost stride.
bool view_strides(const Tensor& tensor, const Shape& shape, Strides* strides) {
  const Shape& old_shape = tensor.shape();
  const Strides& old_strides = tensor.strides();
  const int64_t new_rank = static_cast<int64_t>(shape.size());
  if (tensor.numel() == 0 || old_shape.empty()) {
    *strides = contiguous_strides(shape);
    return true;
  }
  strides->assign(shape.size(), 0);
  int64_t new_dim = new_rank - 1;
  int64_t chunk_inner_stride = old_strides.back();
  int64_t chunk_numel = 1;
  int64_t mapped_numel = 1;
  for (int64_t old_dim = static_cast<int64_t>(old_shape.size()) - 1; old_dim >= 0; --old_dim) {
    chunk_numel *= old_shape[old_dim];
    const bool chunk_ends = old_dim == 0 || (old_shape[old_dim - 1] != 1 &&
                                             old_strides[old_dim - 1] != chunk_numel * chunk_inner_stride);
    if (!chunk_ends) continue;
    while (new_dim >= 0 && (mapped_numel < chunk_numel || shape[new_dim] == 1)) {
      (*strides)[new_dim] = mapped_numel * chunk_inner_stride;
      mapped_numel *= shape[new_dim];
      --new_dim;
    }
    if (mapped_numel != chunk_numel) return false;
    if (old_dim > 0) {
      chunk_inner_stride = old_strides[old_dim - 1];
      chunk_numel = 1;
      mapped_numel = 1;
    }
  }
  return new_dim == -1;
}

class ViewFunction final : public autograd::Function {
 public:
  explicit ViewFunction(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "ViewBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    input_shape_ = inputs[0].shape();
    return {inputs[0].view(shape_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {grads[0].reshape(input_shape_)};
  }

 private:
  Shape shape_, input_shape_;
};

class PermuteFunction final : public autograd::Function {
 public:
  explicit PermuteFunction(Shape order) : order_(std::move(order)) {}
  std::string name() const override { return "PermuteBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {inputs[0].permute(order_)}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Shape inverse(order_.size());
    for (size_t i = 0; i < order_.size(); ++i) inverse[order_[i]] = static_cast<int64_t>(i);
    return {grads[0].permute(inverse)};
  }

 private:
  Shape order_;
};

class NarrowFunction final : public autograd::Function {
 public:
  NarrowFunction(int64_t dim, int64_t start, int64_t length) : dim_(dim), start_(start), length_(length) {}
  std::string name() const override { return "NarrowBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    input_shape_ = inputs[0].shape();
    return {inputs[0].narrow(dim_, start_, length_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor grad = Tensor::zeros(input_shape_, grads[0].dtype(), grads[0].device());
    grad.narrow(dim_, start_, length_).copy_(grads[0]);
    return {grad};
  }

 private:
  int64_t dim_, start_, length_;
  Shape input_shape_;
};

class ExpandFunction final : public autograd::Function {
 public:
  explicit ExpandFunction(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "ExpandBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    input_shape_ = inputs[0].shape();
    return {inputs[0].expand(shape_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {sum_to_shape(grads[0], input_shape_)};
  }

 private:
  Shape shape_, input_shape_;
};

bool records_history(const Tensor& tensor) { return autograd::any_requires_grad({tensor}); }

}  // namespace

Tensor Tensor::view(absl::Span<const int64_t> requested) const {
  Shape shape = infer_shape(requested, numel(), "view", *this);
  if (records_history(*this)) return autograd::apply<ViewFunction>({*this}, shape)[0];
  Strides strides;
  WEFT_CHECK(view_strides(*this, shape, &strides), "view: ", describe(), " with strides ",
             shape_string(this->strides()), " cannot be viewed as ", shape_string(shape),
             " without a copy; use reshape()");
  return make_view(*this, std::move(shape), std::move(strides), offset());
}

Tensor Tensor::reshape(absl::Span<const int64_t> requested) const {
  Shape shape = infer_shape(requested, numel(), "reshape", *this);
  Strides strides;
  if (!view_strides(*this, shape, &strides)) return contiguous().view(shape);
  if (records_history(*this)) return autograd::apply<ViewFunction>({*this}, shape)[0];
  // The strides just computed are the view's: no second view_strides through view().
  return make_view(*this, std::move(shape), std::move(strides), offset());
}

Tensor Tensor::permute(absl::Span<const int64_t> order) const {
  WEFT_CHECK(static_cast<int64_t>(order.size()) == dim(), "permute: order ", shape_string(order),
             " does not match rank ", dim(), " of ", describe());
  Shape normalized(order.size());
  std::vector<bool> used(order.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    normalized[i] = normalize_dim(order[i], shape(), "permute");
    WEFT_CHECK(!used[normalized[i]], "permute: dim ", order[i], " repeats in ", shape_string(order));
    used[normalized[i]] = true;
  }
  if (records_history(*this)) return autograd::apply<PermuteFunction>({*this}, normalized)[0];
  Shape shape(order.size());
  Strides strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    shape[i] = this->shape()[normalized[i]];
    strides[i] = this->strides()[normalized[i]];
  }
  return make_view(*this, std::move(shape), std::move(strides), offset());
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  dim0 = normalize_dim(dim0, shape(), "transpose");
  dim1 = normalize_dim(dim1, shape(), "transpose");
  Shape order(static_cast<size_t>(dim()));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[dim0], order[dim1]);
  return permute(order);
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  dim = normalize_dim(dim, shape(), "narrow");
  WEFT_CHECK(start >= 0 && length >= 0 && start + length <= shape()[dim], "narrow: [", start, ", ",
             start + length, ") is out of range for dim ", dim, " of ", describe());
  if (records_history(*this)) return autograd::apply<NarrowFunction>({*this}, dim, start, length)[0];
  Shape shape = this->shape();
  shape[dim] = length;
  return make_view(*this, std::move(shape), strides(), offset() + start * strides()[dim]);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end) const {
  dim = normalize_dim(dim, shape(), "slice");
  const int64_t size = shape()[dim];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  return narrow(dim, start, end - start);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  dim = normalize_dim(dim, shape(), "select");
  WEFT_CHECK(index >= -shape()[dim] && index < shape()[dim], "select: index ", index, " out of range for dim ", dim,
             " of ", describe());
  if (index < 0) index += shape()[dim];
  return narrow(dim, index, 1).squeeze(dim);
}

Tensor Tensor::expand(absl::Span<const int64_t> requested) const {
  WEFT_CHECK(static_cast<int64_t>(requested.size()) >= dim(), "expand: cannot expand ", describe(), " to ",
             shape_string(requested), " (fewer dims)");
  const size_t lead = requested.size() - static_cast<size_t>(dim());
  Shape shape(requested.size());
  Strides strides(requested.size());
  for (size_t d = 0; d < requested.size(); ++d) {
    if (d < lead) {
      WEFT_CHECK(requested[d] >= 0, "expand: new leading dim ", d, " needs a size, got ", requested[d]);
      shape[d] = requested[d];
      strides[d] = 0;
      continue;
    }
    const int64_t own = this->shape()[d - lead];
    const int64_t want = requested[d] == -1 ? own : requested[d];
    WEFT_CHECK(want >= 0, "expand: invalid size ", requested[d], " for dim ", d, " in ", shape_string(requested));
    WEFT_CHECK(own == want || own == 1, "expand: cannot expand ", describe(), " to ", shape_string(requested),
               " (dim ", d, ": ", own, " to ", want, ")");
    shape[d] = want;
    strides[d] = own == want ? this->strides()[d - lead] : 0;
  }
  if (shape == this->shape()) return *this;
  if (records_history(*this)) return autograd::apply<ExpandFunction>({*this}, shape)[0];
  return make_view(*this, std::move(shape), std::move(strides), offset());
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  dim = normalize_dim(dim, this->dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  shape.insert(shape.begin() + dim, 1);
  return view(shape);
}

Tensor Tensor::squeeze(int64_t dim) const {
  dim = normalize_dim(dim, shape(), "squeeze");
  WEFT_CHECK(shape()[dim] == 1, "squeeze: dim ", dim, " of ", describe(), " has size ", shape()[dim], ", not 1");
  Shape shape = this->shape();
  shape.erase(shape.begin() + dim);
  return view(shape);
}

}  // namespace weft
