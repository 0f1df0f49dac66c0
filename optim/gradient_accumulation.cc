// Scaling accumulated gradients (gradient_accumulation.h).
#include "optim/gradient_accumulation.h"

#include <algorithm>

#include "runtime/backend.h"

namespace weft {

std::vector<DeviceGradients> gradients_by_device(const std::vector<Tensor>& parameters) {
  std::vector<DeviceGradients> groups;
  for (const Tensor& parameter : parameters) {
    const Tensor grad = parameter.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    const auto found = std::find_if(groups.begin(), groups.end(),
                                    [&](const DeviceGradients& group) { return group.device == grad.device(); });
    if (found == groups.end()) {
      groups.push_back({grad.device(), {grad}});
    } else {
      found->grads.push_back(grad);
    }
  }
  return groups;
}

void scale_gradients(const std::vector<Tensor>& parameters, double factor) {
  for (const DeviceGradients& group : gradients_by_device(parameters)) {
    backend_for(group.device).scale_in_place(group.grads, factor);
  }
}

}  // namespace weft
