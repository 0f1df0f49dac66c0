// Master weights: making them and converting their storage to and from f32 values (master_weights.h).
// The conversions run when a checkpoint is saved or loaded, not in a step, so they go through the
// host: one pass over a copy of the tensors, the same on every backend.
#include "optim/master_weights.h"

#include <bit>
#include <cstdint>

#include "runtime/split_master_weights.h"

namespace weft {

Tensor make_master_weights(const Tensor& parameter) {
  if (!needs_master_weights(parameter.dtype())) return Tensor();
  if (parameter.dtype() == kBFloat16) {
    // The parameter is the whole value: every low half is zero.
    return Tensor::zeros(parameter.shape(), kInt16, parameter.device());
  }
  return parameter.detach().to(kFloat32).contiguous();
}

Tensor master_values(const Tensor& parameter, const Tensor& master) {
  check_master_weights(parameter, master, "master_values");
  if (parameter.dtype() != kBFloat16) return master.clone();
  const Tensor high = parameter.detach().to(Device::cpu()).contiguous();  // [..] bf16
  const Tensor low = master.to(Device::cpu()).contiguous();                // [..] i16
  Tensor values = Tensor::empty(parameter.shape(), kFloat32, Device::cpu());
  const BFloat16* high_data = high.data<BFloat16>();
  const int16_t* low_data = low.data<int16_t>();
  float* value_data = values.data<float>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    value_data[i] = std::bit_cast<float>(master_bits(high_data[i].bits, low_data[i]));
  }
  return values.to(parameter.device());
}

Tensor master_from_values(const Tensor& parameter, const Tensor& values) {
  WEFT_CHECK(needs_master_weights(parameter.dtype()), "master_from_values: ", parameter.describe(),
             " has no master weights (only bf16 and f16 parameters do)");
  WEFT_CHECK(values.dtype() == kFloat32 && values.shape() == parameter.shape(), "master_from_values: values ",
             values.describe(), " must be f32 of the shape of ", parameter.describe());
  if (parameter.dtype() != kBFloat16) return values.to(parameter.device()).contiguous().clone();
  const Tensor host_values = values.to(Device::cpu()).contiguous();  // [..] f32
  Tensor low = Tensor::empty(parameter.shape(), kInt16, Device::cpu());
  const float* value_data = host_values.data<float>();
  int16_t* low_data = low.data<int16_t>();
  for (int64_t i = 0; i < low.numel(); ++i) low_data[i] = master_low_half(std::bit_cast<uint32_t>(value_data[i]));
  return low.to(parameter.device());
}

}  // namespace weft
