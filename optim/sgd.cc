// SGD with momentum: the optimizer (state, groups, checkpoint) and its per-parameter update (sgd.h).
#include "optim/sgd.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "optim/master_weights.h"
#include "optim/optimizer.h"
#include "optim/updates_by_device.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/optimizer_update.h"

namespace weft {
namespace {

// One parameter's update for its backend, after checking every tensor fits the parameter.
SgdTensorUpdate tensor_update(const Tensor& parameter, const Tensor& grad, const Tensor& momentum_buffer,
                              const Tensor& master, const SgdStep& step) {
  const Tensor gradient = contiguous_gradient(parameter, grad, "sgd_update");
  const DType state_dtype = optimizer_state_dtype(parameter.dtype());
  WEFT_CHECK(parameter.is_contiguous(), "sgd_update: parameter ", parameter.describe(), " is not contiguous");
  WEFT_CHECK(momentum_buffer.defined() == (step.momentum != 0.0) &&
                 (!momentum_buffer.defined() ||
                  (momentum_buffer.shape() == parameter.shape() && momentum_buffer.dtype() == state_dtype &&
                   momentum_buffer.is_contiguous() && momentum_buffer.device() == parameter.device())),
             "sgd_update: momentum buffer ",
             momentum_buffer.defined() ? momentum_buffer.describe() : std::string("none"),
             " does not fit parameter ", parameter.describe(), " with momentum ", step.momentum,
             " (momentum 0 takes none)");
  check_master_weights(parameter, master, "sgd_update");
  return SgdTensorUpdate{.parameter = parameter,
                         .grad = gradient,
                         .momentum_buffer = momentum_buffer,
                         .master = master,
                         .lr = step.lr,
                         .weight_decay = step.weight_decay};
}

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParameterGroup> groups, const SgdOptions& options)
      : Optimizer(std::move(groups)), options_(options) {
    WEFT_CHECK(options.momentum >= 0.0, "sgd: momentum must be >= 0, got ", options.momentum);
    WEFT_CHECK(!options.nesterov || options.momentum > 0.0, "sgd: nesterov needs a momentum > 0");
    for (const ParameterGroup& group : groups_) {
      for (const NamedParameter& parameter : group.parameters) {
        const Tensor& tensor = parameter.tensor;
        State state;
        if (options.momentum != 0.0) {
          state.momentum_buffer = Tensor::zeros(tensor.shape(), optimizer_state_dtype(tensor.dtype()), tensor.device());
          register_state(parameter.name + ".momentum_buffer", state.momentum_buffer);
        }
        state.master = make_master_weights(tensor);
        if (state.master.defined()) register_master(parameter.name + ".master", tensor, state.master);
        states_.push_back(std::move(state));
      }
    }
  }

  // SGD's update does not depend on its counts, so a skipped previous step changes nothing here.
  void step(double lr, const Tensor& guard, const Tensor& /*previous_guard*/) override {
    WEFT_CHECK(std::isfinite(lr) && lr >= 0.0, "sgd: lr must be finite and >= 0, got ", lr);
    std::vector<SgdTensorUpdate> updates;
    size_t index = 0;
    for (const ParameterGroup& group : groups_) {
      for (const NamedParameter& parameter : group.parameters) {
        const State& state = states_[index++];
        const Tensor grad = parameter.tensor.grad();
        if (!grad.defined()) continue;
        const SgdStep scalars{.lr = lr,
                              .momentum = options_.momentum,
                              .nesterov = options_.nesterov,
                              .weight_decay = group.weight_decay};
        updates.push_back(tensor_update(parameter.tensor, grad, state.momentum_buffer, state.master, scalars));
      }
    }
    // One call per device: every CUDA parameter of a device in one launch.
    const SgdHyperparameters hyperparameters{
        .momentum = options_.momentum, .nesterov = options_.nesterov, .guard = guard};
    for (const DeviceUpdates<SgdTensorUpdate>& group : updates_by_device(std::move(updates))) {
      backend_for(group.device).sgd_update(group.updates, hyperparameters);
    }
    steps_ += 1;
    undoable_ = std::min(undoable_ + 1, kUndoableSteps);
  }

  void undo_step(int later_steps) override {
    WEFT_CHECK(later_steps >= 0 && later_steps < undoable_, "sgd: undo_step(", later_steps,
               ") without such a step to undo (", undoable_, " undoable)");
    steps_ -= 1;
    undoable_ -= 1;
  }

  std::map<std::string, Tensor> state_dict() const override { return snapshot_state(); }
  void load_state_dict(const std::map<std::string, Tensor>& state) override { restore_state(state); }

 private:
  struct State {
    Tensor momentum_buffer;  // parameter's shape, state dtype; undefined when momentum is 0
    Tensor master;           // make_master_weights: i16 low halves for bf16, f32 for f16, undefined otherwise
  };
  SgdOptions options_;
  std::vector<State> states_;  // one per parameter, in group order
  static constexpr int kUndoableSteps = 2;  // as many as can be in flight
  int undoable_ = 0;
};

}  // namespace

void sgd_update(const Tensor& parameter, const Tensor& grad, const Tensor& momentum_buffer, const Tensor& master,
                const SgdStep& step) {
  const SgdTensorUpdate update = tensor_update(parameter, grad, momentum_buffer, master, step);
  SgdHyperparameters hyperparameters;  // no guard
  hyperparameters.momentum = step.momentum;
  hyperparameters.nesterov = step.nesterov;
  backend_for(parameter.device()).sgd_update(absl::Span<const SgdTensorUpdate>(&update, 1), hyperparameters);
}

std::unique_ptr<Optimizer> make_sgd(std::vector<ParameterGroup> groups, const SgdOptions& options) {
  return std::make_unique<Sgd>(std::move(groups), options);
}

}  // namespace weft
