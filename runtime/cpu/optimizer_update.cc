// AdamW and SGD updates on the CPU (runtime/optimizer_update.h): one plain loop per parameter over
// contiguous data, the reference the CUDA multi-tensor kernels are checked against. A large
// parameter's elements are split over the thread pool (each element's update is independent, so
// the split changes no result), and the loops are built for the CPU's vector width.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/parallel_for.h"
#include "runtime/cpu/vectorized.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/split_master_weights.h"

namespace weft {
namespace {

// What a parameter's master is stored as: the i16 low halves for bf16
// (runtime/split_master_weights.h), an f32 copy for f16, nothing (a null pointer of State) otherwise.
template <class Parameter, class State>
using MasterStorage = std::conditional_t<std::is_same_v<Parameter, BFloat16>, int16_t, State>;

// The value element `index` of an update starts from (the master-weight rule of
// runtime/optimizer_update.h): for bf16 the f32 the parameter and its low half make; for f16 the
// master when the parameter still holds its rounding, the parameter otherwise; for other dtypes the
// parameter. `master` is null unless Parameter is 16-bit.
template <class Parameter, class State>
State load_parameter_value(const Parameter* parameter, MasterStorage<Parameter, State>* master, int64_t index) {
  if constexpr (std::is_same_v<Parameter, BFloat16>) {
    return std::bit_cast<float>(master_bits(parameter[index].bits, master[index]));
  } else if constexpr (std::is_same_v<Parameter, Float16>) {
    const Parameter rounded = store_element<Parameter>(master[index]);
    if (rounded.bits != parameter[index].bits) master[index] = load_element(parameter[index]);
    return master[index];
  } else {
    return static_cast<State>(parameter[index]);
  }
}

// Stores the updated value: into the master and, rounded once, into the parameter (for bf16 the
// two halves of its bits).
template <class Parameter, class State>
void store_parameter_value(Parameter* parameter, MasterStorage<Parameter, State>* master, int64_t index,
                           State value) {
  if constexpr (std::is_same_v<Parameter, BFloat16>) {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    parameter[index].bits = master_high_half(bits);
    master[index] = master_low_half(bits);
    return;
  }
  if constexpr (std::is_same_v<Parameter, Float16>) master[index] = value;
  parameter[index] = store_element<Parameter>(value);
}

// `grad` in the state dtype, contiguous: itself when it already is, a converted copy otherwise.
Tensor gradient_in_state_dtype(const Tensor& parameter, const Tensor& grad) {
  const DType state_dtype = statistic_dtype(parameter.dtype());
  return (grad.dtype() == state_dtype ? grad : grad.to(state_dtype)).contiguous();
}

// Calls body.template operator()<Parameter, State>() for the parameter's storage type and the
// type its update computes in.
template <class Body>
void dispatch_parameter(const Tensor& parameter, const char* op, Body&& body) {
  switch (parameter.dtype()) {
    case kFloat32: return body.template operator()<float, float>();
    case kFloat64: return body.template operator()<double, double>();
    case kBFloat16: return body.template operator()<BFloat16, float>();
    case kFloat16: return body.template operator()<Float16, float>();
    default: WEFT_FAIL(op, ": parameter ", parameter.describe(), " is not floating");
  }
}

// One parameter's AdamW update. grad, exp_avg, exp_avg_sq are State; master (MasterStorage) is
// null unless Parameter is 16-bit. Each double scalar is rounded once to State.
// `scale` multiplies every gradient as it is read (AdamWHyperparameters::gradient_scale; 1 without);
// `previous_skipped` picks the scalars of count t - 1 (AdamWHyperparameters::previous_guard).
template <class Parameter, class State>
WEFT_CPU_VECTORIZED void adamw_loop(Parameter* parameter, const State* grad, State* exp_avg, State* exp_avg_sq,
                MasterStorage<Parameter, State>* master,
                int64_t count, const AdamWTensorUpdate& update, const AdamWHyperparameters& hyperparameters,
                State scale, bool previous_skipped) {
  const State decay = static_cast<State>(update.decay);
  const State beta1 = static_cast<State>(hyperparameters.beta1);
  const State one_minus_beta1 = static_cast<State>(1.0 - hyperparameters.beta1);
  const State beta2 = static_cast<State>(hyperparameters.beta2);
  const State one_minus_beta2 = static_cast<State>(1.0 - hyperparameters.beta2);
  const State step_size =
      static_cast<State>(previous_skipped ? update.step_size_if_previous_skipped : update.step_size);
  const State bias_correction2_sqrt = static_cast<State>(
      previous_skipped ? update.bias_correction2_sqrt_if_previous_skipped : update.bias_correction2_sqrt);
  const State eps = static_cast<State>(hyperparameters.eps);
  for (int64_t i = 0; i < count; ++i) {
    State value = load_parameter_value<Parameter, State>(parameter, master, i);
    const State g = grad[i] * scale;
    value = value * decay;
    exp_avg[i] = exp_avg[i] * beta1 + g * one_minus_beta1;
    exp_avg_sq[i] = exp_avg_sq[i] * beta2 + g * g * one_minus_beta2;
    const State denominator = std::sqrt(exp_avg_sq[i]) / bias_correction2_sqrt + eps;
    value = value - step_size * (exp_avg[i] / denominator);
    store_parameter_value<Parameter, State>(parameter, master, i, value);
  }
}

// One parameter's SGD update; buffer is null when momentum is 0, master null unless Parameter is
// 16-bit. Each double scalar is rounded once to State.
template <class Parameter, class State>
WEFT_CPU_VECTORIZED void sgd_loop(Parameter* parameter, const State* grad, State* buffer,
              MasterStorage<Parameter, State>* master, int64_t count,
              const SgdTensorUpdate& update, const SgdHyperparameters& hyperparameters) {
  const State lr = static_cast<State>(update.lr);
  const State momentum = static_cast<State>(hyperparameters.momentum);
  const State weight_decay = static_cast<State>(update.weight_decay);
  for (int64_t i = 0; i < count; ++i) {
    State value = load_parameter_value<Parameter, State>(parameter, master, i);
    State direction = grad[i];
    if (update.weight_decay != 0.0) direction = direction + weight_decay * value;
    if (buffer != nullptr) {
      buffer[i] = momentum * buffer[i] + direction;
      direction = hyperparameters.nesterov ? direction + momentum * buffer[i] : buffer[i];
    }
    value = value - lr * direction;
    store_parameter_value<Parameter, State>(parameter, master, i, value);
  }
}

// Whether a guarded update goes ahead (optimizer_update.h): no guard, or a finite one.
bool guard_allows(const Tensor& guard, const char* op) {
  if (!guard.defined()) return true;
  WEFT_CHECK(guard.numel() == 1 && is_floating(guard.dtype()) && guard.device().is_cpu(), op,
             ": the guard must be one floating element on the CPU, got ", guard.describe());
  return std::isfinite(guard.item());
}

}  // namespace

void CpuBackend::adamw_update(absl::Span<const AdamWTensorUpdate> updates,
                              const AdamWHyperparameters& hyperparameters) {
  if (!guard_allows(hyperparameters.guard, "adamw_update")) return;
  const bool previous_skipped = !guard_allows(hyperparameters.previous_guard, "adamw_update (previous guard)");
  const Tensor& gradient_scale = hyperparameters.gradient_scale;
  if (gradient_scale.defined()) {
    WEFT_CHECK(gradient_scale.numel() == 1 && is_floating(gradient_scale.dtype()) && gradient_scale.device().is_cpu(),
               "adamw_update: the gradient scale must be one floating element on the CPU, got ",
               gradient_scale.describe());
  }
  const double scale = gradient_scale.defined() ? gradient_scale.item() : 1.0;
  for (const AdamWTensorUpdate& update : updates) {
    const Tensor grad = gradient_in_state_dtype(update.parameter, update.grad);
    dispatch_parameter(update.parameter, "adamw_update", [&]<class Parameter, class State>() {
      Parameter* parameter = update.parameter.data<Parameter>();
      const State* gradient = grad.data<State>();
      State* exp_avg = update.exp_avg.data<State>();
      State* exp_avg_sq = update.exp_avg_sq.data<State>();
      auto* master = update.master.defined() ? update.master.data<MasterStorage<Parameter, State>>() : nullptr;
      cpu::parallel_for(update.parameter.numel(), 12, [&](int64_t begin, int64_t end) {
        adamw_loop<Parameter, State>(parameter + begin, gradient + begin, exp_avg + begin, exp_avg_sq + begin,
                                     master != nullptr ? master + begin : nullptr, end - begin, update,
                                     hyperparameters, static_cast<State>(scale), previous_skipped);
      });
    });
  }
}

void CpuBackend::join_master_halves(const Tensor& high, const Tensor& low, const Tensor& values) {
  check_master_halves("join_master_halves", Device::cpu(), values, low, high);
  const BFloat16* high_data = high.data<BFloat16>();
  const int16_t* low_data = low.data<int16_t>();
  float* value_data = values.data<float>();
  cpu::parallel_for(values.numel(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      value_data[i] = std::bit_cast<float>(master_bits(high_data[i].bits, low_data[i]));
    }
  });
}

void CpuBackend::master_low_halves(const Tensor& values, const Tensor& low) {
  check_master_halves("master_low_halves", Device::cpu(), values, low);
  const float* value_data = values.data<float>();
  int16_t* low_data = low.data<int16_t>();
  cpu::parallel_for(values.numel(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) low_data[i] = master_low_half(std::bit_cast<uint32_t>(value_data[i]));
  });
}

void CpuBackend::sgd_update(absl::Span<const SgdTensorUpdate> updates, const SgdHyperparameters& hyperparameters) {
  if (!guard_allows(hyperparameters.guard, "sgd_update")) return;
  for (const SgdTensorUpdate& update : updates) {
    const Tensor grad = gradient_in_state_dtype(update.parameter, update.grad);
    dispatch_parameter(update.parameter, "sgd_update", [&]<class Parameter, class State>() {
      Parameter* parameter = update.parameter.data<Parameter>();
      const State* gradient = grad.data<State>();
      State* buffer = update.momentum_buffer.defined() ? update.momentum_buffer.data<State>() : nullptr;
      auto* master = update.master.defined() ? update.master.data<MasterStorage<Parameter, State>>() : nullptr;
      cpu::parallel_for(update.parameter.numel(), 6, [&](int64_t begin, int64_t end) {
        sgd_loop<Parameter, State>(parameter + begin, gradient + begin, buffer != nullptr ? buffer + begin : nullptr,
                                   master != nullptr ? master + begin : nullptr, end - begin, update, hyperparameters);
      });
    });
  }
}

}  // namespace weft
