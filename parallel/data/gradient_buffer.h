// GradientBuffer: every parameter gradient of a model in persistent flat buckets.
//
// Parameters are grouped into buckets in the order backward produces their gradients (the reverse
// of registration order: the head's first, the embedding's last), each bucket about
// `bucket_bytes` large. A bucket is one contiguous tensor [padded_elements] in the parameters'
// dtype, allocated once; attach() makes each parameter's .grad a view of its slot, so the autograd
// engine accumulates weight gradients into the bucket in place (no allocation, copy or pack per
// step) and a collective can reduce the bucket as it is. The padding (zeros) rounds each bucket up
// to a multiple of `pad_multiple` (the dp size) so that reduce-scatter splits it evenly.
//
// Invariants:
// - every parameter is in exactly one bucket; within a bucket, parameters are in backward order
//   and slots are laid end to end; the members of one gradient group (NamedParameter::
//   gradient_group, written by one product) share a bucket, so that a bucket may exceed
//   `bucket_bytes` by what the group adds;
// - .grad of an attached parameter is a view of its slot until something replaces it (the
//   optimizers never do; Module::to() does, so attach after converting the model);
// - zero() zeros lazily (Tensor::mark_grad_zero): it writes nothing; each gradient's first
//   contribution of the next step overwrites its slot (the weight-gradient GEMMs with beta = 0, the
//   norms' kernels, AccumulateGrad's copy), and a slot read before any arrives (a parameter that got
//   no gradient) gets its zeros then. The views stay valid. A collective that reads a bucket whole
//   calls materialize(bucket) first, so that it never reduces stale contents. The padding is zeroed
//   once, at construction, and never written by anything but collectives of zeros.
#pragma once

#include <cstdint>
#include <vector>

#include "layers/module.h"
#include "runtime/tensor.h"

namespace weft {

class GradientBuffer {
 public:
  struct Slot {
    size_t parameter;   // index into the parameter list given at construction
    int64_t offset;     // first element in the bucket
    int64_t elements;
  };
  struct Bucket {
    std::vector<Slot> slots;     // in backward order
    int64_t elements = 0;        // used
    int64_t padded_elements = 0; // a multiple of pad_multiple
    Tensor data;                 // [padded_elements], the parameters' dtype and device
  };

  // `parameters` in registration order; all of one dtype and device. Throws weft::Error naming a
  // parameter that differs.
  GradientBuffer(std::vector<NamedParameter> parameters, int64_t bucket_bytes, int64_t pad_multiple);

  // Points every parameter's .grad at its slot (contents: whatever the bucket holds).
  void attach();
  // Zeros every gradient lazily (see the invariants above): no pass over the buckets.
  void zero();
  // Writes the zeros of every slot of `bucket` that still counts as zero (on the calling thread's
  // current stream): after it, the bucket's contents are the gradients exactly.
  void materialize(size_t bucket);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  // Which bucket holds parameter `index`, and where.
  size_t bucket_of(size_t parameter) const { return bucket_of_[parameter]; }
  const Slot& slot_of(size_t parameter) const;
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

 private:
  std::vector<NamedParameter> parameters_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;       // per parameter
  std::vector<size_t> slot_index_of_;   // per parameter, into its bucket's slots
  DType dtype_;
  Device device_;
};

}  // namespace weft
