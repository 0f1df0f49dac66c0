// Master weights: full-precision copies of parameters stored in bf16/f16.
//
// A bf16 parameter near 1.0 can only move in steps of 2^-8; an update smaller than half of that
// rounds away every step and training stalls. So the optimizer keeps an f32 "master" copy of each
// 16-bit parameter, applies every update to the master, and writes the master back rounded (to
// nearest even) into the parameter. Small updates accumulate in the master until they move the
// parameter.
//
// Invariant: after each step, parameter == round(master), element by element. When that does not
// hold at the start of a step, something outside the optimizer wrote the parameter (loaded
// weights, a manual edit), and the parameter wins: that element's master restarts from it. This
// keeps a stale master from silently undoing a weight load, at the cost of one compare per element.
//
// Optimizer state (moments, momentum, masters) is f32, or f64 for f64 parameters; gradients of any
// floating dtype are converted to the state dtype before the update.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

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

// `grad` converted to the state dtype and made contiguous (itself when it already is), after
// checking it fits `parameter`. `update_name` ("adamw_update") starts the error message.
inline Tensor gradient_in_state_dtype(const Tensor& parameter, const Tensor& grad, const char* update_name) {
  WEFT_CHECK(grad.defined(), update_name, ": the gradient of ", parameter.describe(), " is undefined");
  WEFT_CHECK(is_floating(grad.dtype()), update_name, ": gradient ", grad.describe(), " is not floating");
  WEFT_CHECK(grad.shape() == parameter.shape() && grad.device() == parameter.device(), update_name,
             ": gradient ", grad.describe(), " does not match parameter ", parameter.describe());
  const DType state_dtype = optimizer_state_dtype(parameter.dtype());
  Tensor converted = grad.dtype() == state_dtype ? grad.detach() : grad.detach().to(state_dtype);
  return converted.contiguous();
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

// The value element `index` of an update starts from: the master when there is one and the
// parameter still holds its rounding, the parameter otherwise (see the invariant above).
// `Parameter` is the parameter's storage type, `State` the compute type (float or double);
// `master` is null unless Parameter is 16-bit.
template <class Parameter, class State>
inline State load_parameter_value(const Parameter* parameter, State* master, int64_t index) {
  if constexpr (std::is_same_v<Parameter, BFloat16> || std::is_same_v<Parameter, Float16>) {
    const Parameter rounded = store_element<Parameter>(master[index]);
    if (rounded.bits != parameter[index].bits) master[index] = load_element(parameter[index]);
    return master[index];
  } else {
    return static_cast<State>(parameter[index]);
  }
}

// Stores the updated value: into the master and, rounded once, into the parameter.
template <class Parameter, class State>
inline void store_parameter_value(Parameter* parameter, State* master, int64_t index, State value) {
  if constexpr (std::is_same_v<Parameter, BFloat16> || std::is_same_v<Parameter, Float16>) {
    master[index] = value;
  }
  parameter[index] = store_element<Parameter>(value);
}

}  // namespace weft
