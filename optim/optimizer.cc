// The Optimizer base: parameter validation, zero_grad, the default decay split, and the generic
// half of checkpointing (every subclass's state is a set of named tensors plus the step count).
#include "optim/optimizer.h"

#include <set>
#include <utility>

#include "optim/master_weights.h"
#include "runtime/error.h"
#include "runtime/shape.h"

namespace weft {

std::vector<ParameterGroup> default_parameter_groups(const std::vector<NamedParameter>& parameters,
                                                     double weight_decay) {
  ParameterGroup decayed{.parameters = {}, .weight_decay = weight_decay};
  ParameterGroup not_decayed{.parameters = {}, .weight_decay = 0.0};
  for (const NamedParameter& parameter : parameters) {
    WEFT_CHECK(parameter.tensor.defined(), "default_parameter_groups: parameter '", parameter.name,
               "' is undefined");
    (parameter.tensor.dim() >= 2 ? decayed : not_decayed).parameters.push_back(parameter);
  }
  std::vector<ParameterGroup> groups;
  // Empty groups are dropped so that a model without biases does not carry a group of nothing.
  if (!decayed.parameters.empty()) groups.push_back(std::move(decayed));
  if (!not_decayed.parameters.empty()) groups.push_back(std::move(not_decayed));
  return groups;
}

Optimizer::Optimizer(std::vector<ParameterGroup> groups) : groups_(std::move(groups)) {
  std::set<std::string> names;
  std::set<const TensorImpl*> tensors;
  for (const ParameterGroup& group : groups_) {
    WEFT_CHECK(group.weight_decay >= 0.0, "optimizer: weight_decay must be >= 0, got ", group.weight_decay);
    for (const NamedParameter& parameter : group.parameters) {
      const Tensor& tensor = parameter.tensor;
      WEFT_CHECK(tensor.defined(), "optimizer: parameter '", parameter.name, "' is undefined");
      WEFT_CHECK(is_floating(tensor.dtype()), "optimizer: parameter '", parameter.name, "' is ",
                 tensor.describe(), "; only floating tensors can be optimized");
      // The update loops walk the storage linearly; parameters are always allocated contiguous.
      WEFT_CHECK(tensor.is_contiguous(), "optimizer: parameter '", parameter.name, "' (", tensor.describe(),
                 ") is not contiguous; pass the parameter itself, not a view of it");
      WEFT_CHECK(names.insert(parameter.name).second, "optimizer: two parameters are named '", parameter.name,
                 "'; names key the optimizer state and must be unique");
      WEFT_CHECK(tensors.insert(tensor.impl()).second, "optimizer: parameter '", parameter.name,
                 "' appears twice (in two groups?); it would be updated twice per step");
    }
  }
}

void Optimizer::step_with_gradient_scale(double lr, const Tensor& guard, const Tensor& gradient_scale,
                                         const Tensor& previous_guard) {
  WEFT_FAIL("this optimizer does not take a gradient scale (takes_gradient_scale() is false); scale the gradients ",
            "before step() instead");
}

void Optimizer::zero_grad() {
  // Dropping the gradient (PyTorch's set_to_none) frees its memory and lets the next backward
  // write a fresh buffer instead of adding to zeros.
  for (ParameterGroup& group : groups_) {
    for (NamedParameter& parameter : group.parameters) parameter.tensor.zero_grad();
  }
}

void Optimizer::register_state(const std::string& key, const Tensor& tensor) {
  WEFT_CHECK(key != "step" && state_.emplace(key, tensor).second, "optimizer: state '", key,
             "' registered twice");
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [key, tensor] : state_) bytes += tensor.numel() * tensor.element_size();
  return bytes;
}

void Optimizer::register_master(const std::string& key, const Tensor& parameter, const Tensor& master) {
  register_state(key, master);
  master_parameters_.emplace(key, parameter);
}

std::map<std::string, Tensor> Optimizer::snapshot_state() const {
  std::map<std::string, Tensor> snapshot;
  // Copies, so that a checkpoint taken now is not changed by the steps that follow.
  for (const auto& [key, tensor] : state_) {
    auto master = master_parameters_.find(key);
    snapshot.emplace(key, master == master_parameters_.end() ? tensor.clone() : master_values(master->second, tensor));
  }
  snapshot.emplace("step", Tensor::scalar(static_cast<double>(steps_), kInt64));
  return snapshot;
}

void Optimizer::restore_state(const std::map<std::string, Tensor>& state) {
  std::string problems;
  auto problem = [&](const std::string& text) { problems += "\n  " + text; };
  auto step_entry = state.find("step");
  if (step_entry == state.end()) {
    problem("missing 'step'");
  } else if (!step_entry->second.defined() || step_entry->second.numel() != 1 ||
             !is_integer(step_entry->second.dtype()) || step_entry->second.item() < 0) {
    problem("'step' must be one non-negative integer, got " +
            (step_entry->second.defined() ? step_entry->second.describe() : std::string("undefined")));
  }
  for (const auto& [key, tensor] : state_) {
    auto entry = state.find(key);
    // A master is saved as its f32 values (register_master), whatever it is stored as.
    const DType saved_dtype = master_parameters_.count(key) == 1 ? kFloat32 : tensor.dtype();
    if (entry == state.end()) {
      problem("missing '" + key + "'");
    } else if (!entry->second.defined()) {
      problem("'" + key + "' is undefined");
    } else if (entry->second.shape() != tensor.shape() || entry->second.dtype() != saved_dtype) {
      problem("'" + key + "' is " + entry->second.describe() + ", expected " + std::string(dtype_name(saved_dtype)) +
              shape_string(tensor.shape()));
    }
  }
  for (const auto& [key, tensor] : state) {
    if (key != "step" && state_.find(key) == state_.end()) {
      problem("unexpected '" + key + "' (a different model, or another optimizer's state?)");
    }
  }
  WEFT_CHECK(problems.empty(), "optimizer load_state_dict: the state does not match this optimizer; nothing "
             "was loaded:", problems);
  for (const auto& [key, tensor] : state_) {
    Tensor target = tensor;  // a handle to the live tensor: copy_ writes through it
    auto master = master_parameters_.find(key);
    target.copy_(master == master_parameters_.end() ? state.at(key)
                                                    : master_from_values(master->second, state.at(key)));
  }
  steps_ = static_cast<int64_t>(step_entry->second.item());
}

}  // namespace weft
