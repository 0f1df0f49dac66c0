// Tensor factories, properties, copies, element access and autograd accessors. The view methods
// live in view.cc.
#include "runtime/tensor.h"

#include <cmath>
#include <sstream>

#include "absl/strings/str_format.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/node.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace weft {
namespace {

// Copy into a new tensor of another dtype and/or device; the gradient goes back the same way.
class CopyFunction final : public autograd::Function {
 public:
  CopyFunction(DType dtype, Device device) : dtype_(dtype), device_(device) {}
  std::string name() const override { return "CopyBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    source_dtype_ = x.dtype();
    source_device_ = x.device();
    Tensor out = Tensor::empty(x.shape(), dtype_, device_);
    out.copy_(x);
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    if (!is_floating(source_dtype_)) return {Tensor()};
    return {grads[0].to(source_device_).to(source_dtype_)};
  }

 private:
  DType dtype_;
  Device device_;
  DType source_dtype_ = kFloat32;
  Device source_device_;
};

Tensor copy_to(const Tensor& x, DType dtype, Device device) {
  return autograd::apply<CopyFunction>({x}, dtype, device)[0];
}

// Byte offset of a multi-index, checked against the shape.
int64_t element_offset(const Tensor& tensor, absl::Span<const int64_t> index) {
  WEFT_CHECK(static_cast<int64_t>(index.size()) == tensor.dim(), "at: index of rank ", index.size(),
             " for tensor ", tensor.describe());
  int64_t offset = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    WEFT_CHECK(index[d] >= 0 && index[d] < tensor.shape()[d], "at: index ", index[d], " out of range for dim ", d,
               " of tensor ", tensor.describe());
    offset += index[d] * tensor.strides()[d];
  }
  return offset;
}

double read_element(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case kFloat32: return static_cast<const float*>(base)[offset];
    case kBFloat16: return static_cast<float>(static_cast<const BFloat16*>(base)[offset]);
    case kFloat16: return static_cast<float>(static_cast<const Float16*>(base)[offset]);
    case kFloat64: return static_cast<const double*>(base)[offset];
    case kInt32: return static_cast<const int32_t*>(base)[offset];
    case kInt64: return static_cast<double>(static_cast<const int64_t*>(base)[offset]);
    case kInt16: return static_cast<const int16_t*>(base)[offset];
  }
  return 0;
}

void write_element(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case kFloat32: static_cast<float*>(base)[offset] = static_cast<float>(value); return;
    case kBFloat16: static_cast<BFloat16*>(base)[offset] = store_element<BFloat16>(value); return;
    case kFloat16: static_cast<Float16*>(base)[offset] = store_element<Float16>(value); return;
    case kFloat64: static_cast<double*>(base)[offset] = value; return;
    case kInt32: static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(value); return;
    case kInt64: static_cast<int64_t*>(base)[offset] = static_cast<int64_t>(value); return;
    case kInt16: static_cast<int16_t*>(base)[offset] = static_cast<int16_t>(value); return;
  }
}

}  // namespace

// --- Factories ------------------------------------------------------------------------------

namespace {

Tensor empty_from(absl::Span<const int64_t> shape, DType dtype, Device device, Allocator& allocator) {
  for (int64_t size : shape) {
    WEFT_CHECK(size >= 0, "empty: negative size in shape ", shape_string(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape) * dtype_size(dtype)), device, allocator);
  impl->shape = Shape(shape.begin(), shape.end());
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace

Tensor Tensor::empty(absl::Span<const int64_t> shape, DType dtype, Device device) {
  return empty_from(shape, dtype, device, allocator_for(device));
}

Tensor Tensor::empty_pinned(absl::Span<const int64_t> shape, DType dtype) {
  return empty_from(shape, dtype, Device::cpu(), pinned_host_allocator());
}

Tensor Tensor::zeros(absl::Span<const int64_t> shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(absl::Span<const int64_t> shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(absl::Span<const int64_t> shape, double value, DType dtype, Device device) {
  Tensor out = empty(shape, dtype, device);
  out.fill_(value);
  return out;
}

Tensor Tensor::from_vector(absl::Span<const double> values, absl::Span<const int64_t> shape, DType dtype,
                           Device device) {
  WEFT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
             " values do not fill shape ", shape_string(shape));
  Tensor host = empty(shape, dtype, Device::cpu());
  for (size_t i = 0; i < values.size(); ++i) write_element(host.raw_data(), dtype, static_cast<int64_t>(i), values[i]);
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::from_vector(absl::Span<const float> values, absl::Span<const int64_t> shape, DType dtype,
                           Device device) {
  std::vector<double> widened(values.begin(), values.end());
  return from_vector(absl::Span<const double>(widened), shape, dtype, device);
}

Tensor Tensor::from_vector(absl::Span<const int64_t> values, absl::Span<const int64_t> shape, DType dtype,
                           Device device) {
  WEFT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
             " values do not fill shape ", shape_string(shape));
  Tensor host = empty(shape, dtype, Device::cpu());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == kInt64) {
      host.data<int64_t>()[i] = values[i];
    } else {
      write_element(host.raw_data(), dtype, static_cast<int64_t>(i), static_cast<double>(values[i]));
    }
  }
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor Tensor::arange(int64_t count, DType dtype, Device device) {
  WEFT_CHECK(count >= 0, "arange: count ", count, " is negative");
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = i;
  return from_vector(absl::Span<const int64_t>(values), {count}, dtype, device);
}

Tensor Tensor::uniform(absl::Span<const int64_t> shape, uint64_t seed, uint64_t offset, double low, double high,
                       DType dtype, Device device) {
  WEFT_CHECK(is_floating(dtype), "uniform: dtype ", dtype_name(dtype), " is not floating");
  WEFT_CHECK(std::isfinite(low) && std::isfinite(high) && low < high, "uniform: the range [", low, ", ", high,
             ") is empty or not finite");
  Tensor out = empty(shape, dtype, device);
  backend_for(device).fill_random(out, RandomDistribution::kUniform, seed, offset, low, high);
  return out;
}

Tensor Tensor::normal(absl::Span<const int64_t> shape, uint64_t seed, uint64_t offset, double mean, double std,
                      DType dtype, Device device) {
  WEFT_CHECK(is_floating(dtype), "normal: dtype ", dtype_name(dtype), " is not floating");
  WEFT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal: mean ", mean, " and std ", std,
             " must be finite, std >= 0");
  Tensor out = empty(shape, dtype, device);
  backend_for(device).fill_random(out, RandomDistribution::kNormal, seed, offset, mean, std);
  return out;
}

// --- Properties -----------------------------------------------------------------------------

int64_t Tensor::size(int64_t dim) const { return impl_->shape[normalize_dim(dim, impl_->shape, "size")]; }

int64_t Tensor::stride(int64_t dim) const { return impl_->strides[normalize_dim(dim, impl_->shape, "stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (impl_->shape[d] == 1) continue;
    if (impl_->strides[d] != expected) return false;
    expected *= impl_->shape[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return str(dtype_name(dtype()), shape_string(shape()), " ", device().to_string());
}

// --- Copies ---------------------------------------------------------------------------------

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const { return copy_to(*this, dtype(), device()); }

Tensor Tensor::to(DType dtype) const { return dtype == this->dtype() ? *this : copy_to(*this, dtype, device()); }

Tensor Tensor::to(Device device) const {
  return device == this->device() ? *this : copy_to(*this, dtype(), device);
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->autograd = nullptr;
  return Tensor(std::move(impl));
}

// --- In place -------------------------------------------------------------------------------

Tensor& Tensor::fill_(double value) {
  backend_for(device()).fill(*this, value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& source) {
  WEFT_CHECK(source.defined(), "copy_: source is undefined");
  Tensor expanded = source;
  if (source.shape() != shape()) {
    bool broadcastable = source.dim() <= dim();
    for (int64_t d = 0; broadcastable && d < source.dim(); ++d) {
      const int64_t size = source.shape()[d], target = shape()[dim() - source.dim() + d];
      broadcastable = size == target || size == 1;
    }
    WEFT_CHECK(broadcastable, "copy_: source ", source.describe(), " cannot be broadcast to destination ", describe());
    autograd::NoGradGuard no_grad;
    expanded = source.expand(shape());
  }
  if (source.device() == device()) {
    backend_for(device()).copy(expanded, *this);
  } else {
    // Cross-device copies are done by the device backend (host <-> device transfers).
    const Device other = device().is_cpu() ? source.device() : device();
    backend_for(other).copy(expanded, *this);
  }
  return *this;
}

// --- Element access -------------------------------------------------------------------------

double Tensor::at(absl::Span<const int64_t> index) const {
  if (!device().is_cpu()) return to(Device::cpu()).at(index);
  const int64_t offset = element_offset(*this, index);
  return read_element(raw_data(), dtype(), offset);
}

void Tensor::set(absl::Span<const int64_t> index, double value) {
  WEFT_CHECK(device().is_cpu(), "set: element writes need a CPU tensor, got ", describe());
  write_element(raw_data(), dtype(), element_offset(*this, index), value);
}

double Tensor::item() const {
  WEFT_CHECK(numel() == 1, "item: tensor ", describe(), " has ", numel(), " elements, not 1");
  Tensor flat = contiguous();
  if (!flat.device().is_cpu()) flat = flat.to(Device::cpu());
  return read_element(flat.raw_data(), flat.dtype(), 0);
}

std::vector<double> Tensor::to_vector() const {
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  host = host.contiguous();
  std::vector<double> values(static_cast<size_t>(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) values[i] = read_element(host.raw_data(), host.dtype(), i);
  return values;
}

std::string Tensor::to_string(int64_t max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  autograd::NoGradGuard no_grad;
  std::vector<double> values = to_vector();
  std::ostringstream text;
  text << "Tensor(" << describe() << ", [";
  for (int64_t i = 0; i < numel() && i < max_elements; ++i) {
    if (i > 0) text << ", ";
    text << absl::StrFormat("%.6g", values[i]);
  }
  if (numel() > max_elements) text << ", ...";
  text << "])";
  return text.str();
}

std::ostream& operator<<(std::ostream& stream, const Tensor& tensor) { return stream << tensor.to_string(); }

// --- Autograd -------------------------------------------------------------------------------

bool Tensor::requires_grad() const { return impl_->autograd != nullptr && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  WEFT_CHECK(!requires_grad || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, "
             "got ", describe());
  WEFT_CHECK(is_leaf(), "set_requires_grad: ", describe(), " is the result of an op; call detach() first");
  if (impl_->autograd == nullptr) impl_->autograd = std::make_shared<autograd::AutogradMeta>();
  impl_->autograd->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return impl_->autograd == nullptr || impl_->autograd->grad_fn == nullptr; }

Tensor Tensor::grad() const {
  if (impl_->autograd == nullptr) return Tensor();
  autograd::AutogradMeta& meta = *impl_->autograd;
  if (meta.grad_counts_as_zero) {
    // Read before any gradient arrived: the zeros it counts as are written now.
    autograd::NoGradGuard no_grad;
    meta.grad.zero_();
    meta.grad_counts_as_zero = false;
  }
  return meta.grad;
}

void Tensor::set_grad(const Tensor& grad) {
  WEFT_CHECK(!grad.defined() || (grad.shape() == shape() && grad.device() == device() && is_floating(grad.dtype())),
             "set_grad: gradient ", grad.describe(), " does not fit ", describe(),
             " (same shape and device, floating dtype)");
  if (impl_->autograd == nullptr) impl_->autograd = std::make_shared<autograd::AutogradMeta>();
  impl_->autograd->grad = grad;
  impl_->autograd->grad_counts_as_zero = false;
}

void Tensor::zero_grad() {
  if (impl_->autograd == nullptr) return;
  impl_->autograd->grad = Tensor();
  impl_->autograd->grad_counts_as_zero = false;
}

void Tensor::mark_grad_zero() {
  if (impl_->autograd != nullptr && impl_->autograd->grad.defined()) impl_->autograd->grad_counts_as_zero = true;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  return impl_->autograd == nullptr ? nullptr : impl_->autograd->grad_fn;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

void Tensor::register_grad_ready_hook(std::function<void(Tensor&)> hook) {
  WEFT_CHECK(is_leaf() && requires_grad(), "register_grad_ready_hook: ", describe(),
             " is not a leaf that requires grad");
  impl_->autograd->grad_ready_hooks.push_back(std::move(hook));
}

}  // namespace weft
