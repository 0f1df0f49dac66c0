// Tensor: an n-dimensional view of typed elements in a shared Storage.
//
// A Tensor is a cheap handle (a shared pointer to its TensorImpl); copying a Tensor aliases it.
// Views (view, reshape when possible, permute, transpose, narrow, slice, expand, squeeze, unsqueeze)
// share storage and never copy; contiguous(), clone() and to() copy. Every view and op records
// autograd history when grad mode is on and an input requires grad (see runtime/autograd/).
//
// Invariants: offset + sum((shape[i]-1) * strides[i]) stays inside the storage for non-empty
// tensors; strides are in elements; a dtype never changes for a given TensorImpl.
//
// Element access (at, set, item, to_vector) is for tests and printing: it reads one element at a
// time through the dtype's conversion and works on CPU tensors (device tensors are copied first).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/shape.h"
#include "runtime/storage.h"

namespace weft {

class Tensor;
namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;
  DType dtype = kFloat32;
  std::shared_ptr<autograd::AutogradMeta> autograd;  // null until autograd needs it
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- Factories --------------------------------------------------------------------------
  static Tensor empty(absl::Span<const int64_t> shape, DType dtype = kFloat32, Device device = Device::cpu());
  // A CPU tensor in pinned_host_allocator()'s memory (page-locked with a CUDA backend), so that
  // device copies into and out of it run at full transfer speed. For long-lived staging buffers.
  static Tensor empty_pinned(absl::Span<const int64_t> shape, DType dtype = kFloat32);
  static Tensor zeros(absl::Span<const int64_t> shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor ones(absl::Span<const int64_t> shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor full(absl::Span<const int64_t> shape, double value, DType dtype = kFloat32,
                     Device device = Device::cpu());
  // Copies `values` (row-major) into a new tensor of `shape`, converting to `dtype`.
  static Tensor from_vector(absl::Span<const double> values, absl::Span<const int64_t> shape,
                            DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor from_vector(absl::Span<const float> values, absl::Span<const int64_t> shape,
                            DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor from_vector(absl::Span<const int64_t> values, absl::Span<const int64_t> shape,
                            DType dtype = kInt64, Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = kFloat32, Device device = Device::cpu());
  // [0, 1, ..., count-1].
  static Tensor arange(int64_t count, DType dtype = kInt64, Device device = Device::cpu());
  // Counter-based random numbers (Philox 4x32-10 keyed by seed): element i draws from counter
  // (offset + i), so any backend produces the same values for the same (seed, offset).
  static Tensor uniform(absl::Span<const int64_t> shape, uint64_t seed, uint64_t offset = 0, double low = 0.0,
                        double high = 1.0, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor normal(absl::Span<const int64_t> shape, uint64_t seed, uint64_t offset = 0, double mean = 0.0,
                       double std = 1.0, DType dtype = kFloat32, Device device = Device::cpu());

  // --- Properties ------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t dim) const;      // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  int64_t offset() const { return impl_->offset; }
  int64_t element_size() const { return dtype_size(impl_->dtype); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // Pointer to the first element (storage base + offset).
  void* raw_data() const;
  template <class T>
  T* data() const { return static_cast<T*>(raw_data()); }
  // "f32[2, 3] cpu".
  std::string describe() const;

  // --- Views (no copy) -------------------------------------------------------------------
  // New shape with the same elements; one size may be -1. Fails if the strides do not allow a view.
  Tensor view(absl::Span<const int64_t> shape) const;
  // A view when the strides allow it, otherwise a contiguous copy.
  Tensor reshape(absl::Span<const int64_t> shape) const;
  Tensor flatten() const { return reshape({-1}); }
  Tensor permute(absl::Span<const int64_t> order) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  // Elements [start, start + length) of `dim`.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Elements [start, end) of `dim` (negative indices count from the end).
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;
  // Element `index` of `dim`, removing that dim.
  Tensor select(int64_t dim, int64_t index) const;
  // Broadcast to `shape` (sizes of 1 become stride-0 dims; new leading dims are added); -1 keeps a size.
  Tensor expand(absl::Span<const int64_t> shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  // --- Copies ----------------------------------------------------------------------------
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  // Same storage and geometry, no autograd history.
  Tensor detach() const;

  // --- In place (not recorded by autograd) -----------------------------------------------
  Tensor& fill_(double value);
  // Copies `source` (broadcast to this shape, converted to this dtype) into this tensor.
  Tensor& copy_(const Tensor& source);
  Tensor& zero_() { return fill_(0.0); }

  // --- Element access (tests, printing) --------------------------------------------------
  double at(absl::Span<const int64_t> index) const;
  void set(absl::Span<const int64_t> index, double value);
  double item() const;  // the one element of a one-element tensor
  // All elements in row-major order, converted to double.
  std::vector<double> to_vector() const;
  std::string to_string(int64_t max_elements = 64) const;

  // --- Autograd --------------------------------------------------------------------------
  bool requires_grad() const;
  // Marks a leaf tensor as a parameter that accumulates .grad; returns *this.
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  // The accumulated gradient (undefined until a backward reached it). After mark_grad_zero, the
  // first call before any gradient arrives writes the zeros into .grad's storage.
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  void zero_grad();  // drops .grad
  // Zeros .grad lazily, keeping its storage (views of it stay valid): nothing is written now; the
  // next gradient accumulated into it overwrites it (an op adding in place writes instead of
  // adding: AccumulateGrad::gradient_storage_counts_as_zero), and grad() writes zeros if it is
  // read first. A step saves a pass over every gradient this way (GradientBuffer::zero).
  void mark_grad_zero();
  std::shared_ptr<autograd::Node> grad_fn() const;
  // Runs backward from this tensor. `gradient` defaults to 1 for a one-element tensor.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Called with this leaf tensor each time a backward pass finishes accumulating its .grad.
  void register_grad_ready_hook(std::function<void(Tensor&)> hook);

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& stream, const Tensor& tensor);

// Arithmetic operators (differentiable; defined in runtime/ops/elementwise.cc).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, double scale);
Tensor operator*(double scale, const Tensor& a);
Tensor operator-(const Tensor& a);

}  // namespace weft
