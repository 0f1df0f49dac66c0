// Master weights: the f32 values of parameters stored in bf16/f16, and the checks an update makes
// of the tensors it is given.
//
// A bf16 parameter near 1.0 can only move in steps of 2^-8; an update smaller than half of that
// rounds away every step and training stalls. So the optimizer keeps an f32 "master" of each
// 16-bit parameter; the backend's update (runtime/optimizer_update.h, which states the rule and
// what happens when the parameter was written from outside) applies every update to the master
// and writes it back rounded into the parameter, so small updates accumulate in the master until
// they move the parameter.
//
// How a master is stored: for a bf16 parameter, as the i16 low halves of the f32 values whose high
// halves the parameter holds (runtime/split_master_weights.h), 2 bytes a parameter instead of 4,
// with the same f32 values; for an f16 parameter, as an f32 copy (f16 is not the top of an f32).
// Checkpoints see f32 either way: master_values() and master_from_values() convert, so a state
// dict holds "<name>.master" as the f32 values whatever the storage.
//
// Optimizer state (moments, momentum, masters' values) is f32, or f64 for f64 parameters;
// gradients may be of any floating dtype (the backend reads them in the state dtype).
#pragma once

#include <string>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace weft {

// The dtype of optimizer state for a parameter of `parameter_dtype`.
inline DType optimizer_state_dtype(DType parameter_dtype) {
  return statistic_dtype(parameter_dtype);
}

inline bool needs_master_weights(DType parameter_dtype) {
  return parameter_dtype == kBFloat16 || parameter_dtype == kFloat16;
}

// The dtype a master of a `parameter_dtype` parameter is stored in: i16 (low halves) for bf16, f32
// for f16. Only for dtypes that needs_master_weights().
inline DType master_storage_dtype(DType parameter_dtype) {
  return parameter_dtype == kBFloat16 ? kInt16 : kFloat32;
}

// The master of `parameter` when it is 16-bit, holding exactly the parameter's values (for bf16:
// zero low halves); an undefined tensor otherwise.
Tensor make_master_weights(const Tensor& parameter);

// The f32 values of the master `master` of `parameter` ([..] f32 on the parameter's device; a copy,
// not a view, for either storage).
Tensor master_values(const Tensor& parameter, const Tensor& master);

// The master of `parameter` that holds `values` ([..] f32, the parameter's shape), in the storage
// of master_storage_dtype, on the parameter's device. For bf16 the low halves are those of the
// values; they make the values exactly with a parameter equal to the values rounded (ties away
// from zero: runtime/split_master_weights.h), as a parameter saved beside its master is.
Tensor master_from_values(const Tensor& parameter, const Tensor& values);

// `grad` made contiguous (itself when it already is), after checking it fits `parameter`: defined,
// floating, the parameter's shape and device. `update_name` ("adamw_update") starts the message.
inline Tensor contiguous_gradient(const Tensor& parameter, const Tensor& grad, const char* update_name) {
  WEFT_CHECK(grad.defined(), update_name, ": the gradient of ", parameter.describe(), " is undefined");
  WEFT_CHECK(is_floating(grad.dtype()), update_name, ": gradient ", grad.describe(), " is not floating");
  WEFT_CHECK(grad.shape() == parameter.shape() && grad.device() == parameter.device(), update_name,
             ": gradient ", grad.describe(), " does not match parameter ", parameter.describe());
  return grad.detach().contiguous();
}

// Checks that `master` is what make_master_weights() gives `parameter`: a contiguous tensor of its
// shape on its device (i16 for bf16, f32 for f16) for a 16-bit parameter, undefined for any other.
inline void check_master_weights(const Tensor& parameter, const Tensor& master, const char* update_name) {
  const bool fits = master.defined()
                        ? needs_master_weights(parameter.dtype()) &&
                              master.dtype() == master_storage_dtype(parameter.dtype()) &&
                              master.shape() == parameter.shape() && master.is_contiguous() &&
                              master.device() == parameter.device()
                        : !needs_master_weights(parameter.dtype());
  WEFT_CHECK(fits, update_name, ": a bf16 parameter needs an i16 master (low halves) of its shape, an f16 ",
             "parameter an f32 master, other dtypes none; got ",
             master.defined() ? master.describe() : std::string("none"), " for ", parameter.describe());
}

}  // namespace weft
