// GradientBuffer (gradient_buffer.h).
#include "parallel/data/gradient_buffer.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"

namespace weft {

GradientBuffer::GradientBuffer(std::vector<NamedParameter> parameters, int64_t bucket_bytes, int64_t pad_multiple)
    : parameters_(std::move(parameters)) {
  WEFT_CHECK(!parameters_.empty(), "gradient buffer: the model has no parameters");
  WEFT_CHECK(bucket_bytes > 0 && pad_multiple > 0, "gradient buffer: bucket size ", bucket_bytes, " and padding ",
             pad_multiple, " must be positive");
  dtype_ = parameters_[0].tensor.dtype();
  device_ = parameters_[0].tensor.device();
  for (const NamedParameter& parameter : parameters_) {
    WEFT_CHECK(parameter.tensor.dtype() == dtype_ && parameter.tensor.device() == device_, "gradient buffer: parameter ",
               parameter.name, " is ", parameter.tensor.describe(), "; every parameter must be ", dtype_name(dtype_),
               " on ", device_.to_string());
  }
  bucket_of_.assign(parameters_.size(), 0);
  slot_index_of_.assign(parameters_.size(), 0);
  const int64_t element_bytes = dtype_size(dtype_);
  Bucket bucket;
  auto close = [&] {
    bucket.padded_elements = (bucket.elements + pad_multiple - 1) / pad_multiple * pad_multiple;
    bucket.data = Tensor::zeros({bucket.padded_elements}, dtype_, device_);
    buckets_.push_back(std::move(bucket));
    bucket = Bucket();
  };
  // Backward order: the last registered parameters get their gradients first.
  for (size_t i = parameters_.size(); i-- > 0;) {
    const int64_t elements = parameters_[i].tensor.numel();
    bucket_of_[i] = buckets_.size();
    slot_index_of_[i] = bucket.slots.size();
    bucket.slots.push_back({i, bucket.elements, elements});
    bucket.elements += elements;
    // Never between two members of one gradient group (NamedParameter::gradient_group): one product
    // writes their gradients, so their slots stay next to each other.
    const bool group_continues = i > 0 && !parameters_[i].gradient_group.empty() &&
                                 parameters_[i - 1].gradient_group == parameters_[i].gradient_group;
    if (bucket.elements * element_bytes >= bucket_bytes && !group_continues) close();
  }
  if (!bucket.slots.empty()) close();
}

const GradientBuffer::Slot& GradientBuffer::slot_of(size_t parameter) const {
  return buckets_[bucket_of_[parameter]].slots[slot_index_of_[parameter]];
}

void GradientBuffer::attach() {
  for (const Bucket& bucket : buckets_) {
    for (const Slot& slot : bucket.slots) {
      Tensor& parameter = parameters_[slot.parameter].tensor;
      parameter.set_grad(bucket.data.narrow(0, slot.offset, slot.elements).view(parameter.shape()));
    }
  }
}

void GradientBuffer::zero() {
  for (NamedParameter& parameter : parameters_) parameter.tensor.mark_grad_zero();
}

void GradientBuffer::materialize(size_t bucket) {
  WEFT_CHECK(bucket < buckets_.size(), "gradient buffer: bucket ", bucket, " of ", buckets_.size());
  // grad() writes the zeros of a slot that still counts as zero.
  for (const Slot& slot : buckets_[bucket].slots) parameters_[slot.parameter].tensor.grad();
}

}  // namespace weft
