// Master weights: full-precision copies of parameters stored in bf16/f16, and the checks an update
// makes of the tensors it is given.
//
// A bf16 parameter near 1.0 can only move in steps of 2^-8; an update smaller than half of that
// rounds away every step and training stalls. So the optimizer keeps an f32 "master" copy of each
// 16-bit parameter; the backend's update (runtime/optimizer_update.h, which states the rule and
// what happens when the parameter was written from outside) applies every update to the master
// and writes it back rounded into the parameter, so small updates accumulate in the master until
// they move the parameter.
//
// Optimizer state (moments, momentum, masters) is f32, or f64 for f64 parameters; gradients may be
// of any floating dtype (the backend reads them in the state dtype).
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

// An f32 copy of `parameter` when it is 16-bit; an undefined tensor otherwise.
inline Tensor make_master_weights(const Tensor& parameter) {
  if (!needs_master_weights(parameter.dtype())) return Tensor();
  return parameter.detach().to(kFloat32).contiguous();
}

// `grad` made contiguous (itself when it already is), after checking it fits `parameter`: defined,
// floating, the parameter's shape and device. `update_name` ("adamw_update") starts the message.
inline Tensor contiguous_gradient(const Tensor& parameter, const Tensor& grad, const char* update_name) {
  WEFT_CHECK(grad.defined(), update_name, ": the gradient of ", parameter.describe(), " is undefined");
  WEFT_CHECK(is_floating(grad.dtype()), update_name, ": gradient ", grad.describe(), " is not floating");
  WEFT_CHECK(grad.shape() == parameter.shape() && grad.device() == parameter.device(), update_name,
             ": gradient ", grad.describe(), " does not match parameter ", parameter.describe());
  return grad.detach().contiguous();
}

// Checks that `master` is what make_master_weights() gives `parameter`: an f32 contiguous tensor of its
// shape on its device for a bf16/f16 parameter, undefined for any other.
inline void check_master_weights(const Tensor& parameter, const Tensor& master, const char* update_name) {
  const bool fits = master.defined()
                        ? needs_master_weights(parameter.dtype()) && master.dtype() == kFloat32 &&
                              master.shape() == parameter.shape() && master.is_contiguous() &&
                              master.device() == parameter.device()
                        : !needs_master_weights(parameter.dtype());
  WEFT_CHECK(fits, update_name, ": a bf16/f16 parameter needs an f32 master of its shape, other dtypes none; got ",
             master.defined() ? master.describe() : std::string("none"), " for ", parameter.describe());
}

}  // namespace weft
