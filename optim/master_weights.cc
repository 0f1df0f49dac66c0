// Master weights: making them and converting their storage to and from f32 values (master_weights.h).
// The conversions run when a checkpoint is saved or loaded, not in a step; they run where the
// tensors live (Backend::join_master_halves, master_low_halves), so a checkpoint of a GPU run copies
// each master to the host once, as f32, and nothing goes to the host and back.
#include "optim/master_weights.h"

#include "runtime/backend.h"

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
  Tensor values = Tensor::empty(parameter.shape(), kFloat32, parameter.device());  // [..] f32
  backend_for(parameter.device()).join_master_halves(parameter.detach().contiguous(), master, values);
  return values;
}

Tensor master_from_values(const Tensor& parameter, const Tensor& values) {
  WEFT_CHECK(needs_master_weights(parameter.dtype()), "master_from_values: ", parameter.describe(),
             " has no master weights (only bf16 and f16 parameters do)");
  WEFT_CHECK(values.dtype() == kFloat32 && values.shape() == parameter.shape(), "master_from_values: values ",
             values.describe(), " must be f32 of the shape of ", parameter.describe());
  if (parameter.dtype() != kBFloat16) return values.to(parameter.device()).contiguous().clone();
  const Tensor on_device = values.to(parameter.device()).contiguous();  // [..] f32
  Tensor low = Tensor::empty(parameter.shape(), kInt16, parameter.device());
  backend_for(parameter.device()).master_low_halves(on_device, low);
  return low;
}

}  // namespace weft
