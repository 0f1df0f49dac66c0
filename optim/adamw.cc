// AdamW: the optimizer (state, groups, checkpoint) and its per-parameter update (adamw.h).
#include "optim/adamw.h"

#include <cmath>
#include <cstdint>
#include <deque>
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

// One parameter's update for its backend, after checking every tensor fits the parameter. The
// per-step scalars are computed here in double, once for every device; the backend rounds each
// once to the state dtype, as PyTorch passes Python floats to its kernels.
AdamWTensorUpdate tensor_update(const Tensor& parameter, const Tensor& grad, const Tensor& exp_avg,
                                const Tensor& exp_avg_sq, const Tensor& master, const AdamWStep& step) {
  WEFT_CHECK(step.step >= 1, "adamw_update: step must be >= 1, got ", step.step);
  const Tensor gradient = contiguous_gradient(parameter, grad, "adamw_update");
  const DType state_dtype = optimizer_state_dtype(parameter.dtype());
  for (const Tensor* state : {&exp_avg, &exp_avg_sq}) {
    WEFT_CHECK(state->shape() == parameter.shape() && state->dtype() == state_dtype && state->is_contiguous() &&
                   state->device() == parameter.device(),
               "adamw_update: state ", state->describe(), " does not fit parameter ", parameter.describe());
  }
  WEFT_CHECK(parameter.is_contiguous(), "adamw_update: parameter ", parameter.describe(), " is not contiguous");
  check_master_weights(parameter, master, "adamw_update");
  // step_size and sqrt(1 - beta2^t) at count t.
  const auto scalars_at = [&](int64_t t) {
    const double bias_correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(t));
    return std::pair<double, double>(step.lr / bias_correction1, std::sqrt(bias_correction2));
  };
  const auto [step_size, bias_correction2_sqrt] = scalars_at(step.step);
  // Count t - 1 where the previous step in flight turns out skipped (runtime/optimizer_update.h);
  // a first step has no previous one, and keeps its own.
  const auto [step_size_if_previous_skipped, bias_correction2_sqrt_if_previous_skipped] =
      step.step >= 2 ? scalars_at(step.step - 1) : std::pair<double, double>(step_size, bias_correction2_sqrt);
  return AdamWTensorUpdate{.parameter = parameter,
                           .grad = gradient,
                           .exp_avg = exp_avg,
                           .exp_avg_sq = exp_avg_sq,
                           .master = master,
                           .step_size = step_size,
                           .bias_correction2_sqrt = bias_correction2_sqrt,
                           .decay = 1.0 - step.lr * step.weight_decay,
                           .step_size_if_previous_skipped = step_size_if_previous_skipped,
                           .bias_correction2_sqrt_if_previous_skipped = bias_correction2_sqrt_if_previous_skipped};
}

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParameterGroup> groups, const AdamWOptions& options)
      : Optimizer(std::move(groups)), options_(options) {
    WEFT_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "adamw: beta1 must be in [0, 1), got ", options.beta1);
    WEFT_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "adamw: beta2 must be in [0, 1), got ", options.beta2);
    WEFT_CHECK(options.eps >= 0.0, "adamw: eps must be >= 0, got ", options.eps);
    for (const ParameterGroup& group : groups_) {
      for (const NamedParameter& parameter : group.parameters) {
        const Tensor& tensor = parameter.tensor;
        const DType state_dtype = optimizer_state_dtype(tensor.dtype());
        State state{
            .exp_avg = Tensor::zeros(tensor.shape(), state_dtype, tensor.device()),
            .exp_avg_sq = Tensor::zeros(tensor.shape(), state_dtype, tensor.device()),
            .master = make_master_weights(tensor),
            // Per parameter, as in PyTorch: a parameter skipped for lack of a gradient keeps its own
            // bias correction. Kept on the CPU: it is read by the host to compute the step scalars.
            .step = Tensor::zeros({}, kInt64),
        };
        register_state(parameter.name + ".exp_avg", state.exp_avg);
        register_state(parameter.name + ".exp_avg_sq", state.exp_avg_sq);
        register_state(parameter.name + ".step", state.step);
        if (state.master.defined()) register_master(parameter.name + ".master", tensor, state.master);
        states_.push_back(std::move(state));
      }
    }
  }

  void step(double lr, const Tensor& guard, const Tensor& previous_guard) override {
    step_with_gradient_scale(lr, guard, Tensor(), previous_guard);
  }

  bool takes_gradient_scale() const override { return true; }

  void step_with_gradient_scale(double lr, const Tensor& guard, const Tensor& gradient_scale,
                                const Tensor& previous_guard) override {
    WEFT_CHECK(std::isfinite(lr) && lr >= 0.0, "adamw: lr must be finite and >= 0, got ", lr);
    std::vector<AdamWTensorUpdate> updates;
    std::vector<int64_t*> counts;  // the step count of each entry of `updates`
    size_t index = 0;
    for (const ParameterGroup& group : groups_) {
      for (const NamedParameter& parameter : group.parameters) {
        State& state = states_[index++];
        const Tensor grad = parameter.tensor.grad();
        if (!grad.defined()) continue;
        int64_t& count = *state.step.data<int64_t>();
        const AdamWStep scalars{.lr = lr,
                                .beta1 = options_.beta1,
                                .beta2 = options_.beta2,
                                .eps = options_.eps,
                                .weight_decay = group.weight_decay,
                                .step = count + 1};
        updates.push_back(
            tensor_update(parameter.tensor, grad, state.exp_avg, state.exp_avg_sq, state.master, scalars));
        counts.push_back(&count);
      }
    }
    // One call per device: every CUDA parameter of a device in one launch.
    const AdamWHyperparameters hyperparameters{.beta1 = options_.beta1,
                                               .beta2 = options_.beta2,
                                               .eps = options_.eps,
                                               .guard = guard,
                                               .gradient_scale = gradient_scale,
                                               .previous_guard = previous_guard};
    for (const DeviceUpdates<AdamWTensorUpdate>& group : updates_by_device(std::move(updates))) {
      backend_for(group.device).adamw_update(group.updates, hyperparameters);
    }
    for (int64_t* count : counts) *count += 1;
    steps_ += 1;
    advanced_.push_front(std::move(counts));
    if (advanced_.size() > kUndoableSteps) advanced_.pop_back();
  }

  void undo_step(int later_steps) override {
    WEFT_CHECK(later_steps >= 0 && static_cast<size_t>(later_steps) < advanced_.size(),
               "adamw: undo_step(", later_steps, ") without such a step to undo (", advanced_.size(),
               " undoable)");
    const auto undone = advanced_.begin() + later_steps;
    for (int64_t* count : *undone) *count -= 1;
    steps_ -= 1;
    advanced_.erase(undone);
  }

  std::map<std::string, Tensor> state_dict() const override { return snapshot_state(); }
  void load_state_dict(const std::map<std::string, Tensor>& state) override {
    restore_state(state);
    advanced_.clear();  // loaded counts are applied ones
  }

 private:
  struct State {
    Tensor exp_avg;     // parameter's shape, state dtype
    Tensor exp_avg_sq;  // parameter's shape, state dtype
    Tensor master;      // make_master_weights: i16 low halves for bf16, f32 for f16, undefined otherwise
    Tensor step;        // i64 scalar, CPU: updates applied to this parameter
  };
  AdamWOptions options_;
  std::vector<State> states_;  // one per parameter, in group order
  // The counts each of the last steps advanced, the latest first (undo_step); as many steps as can
  // be in flight, and no step whose counts were taken back.
  static constexpr size_t kUndoableSteps = 2;
  std::deque<std::vector<int64_t*>> advanced_;
};

}  // namespace

void adamw_update(const Tensor& parameter, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                  const Tensor& master, const AdamWStep& step) {
  const AdamWTensorUpdate update = tensor_update(parameter, grad, exp_avg, exp_avg_sq, master, step);
  AdamWHyperparameters hyperparameters;  // no guard, no gradient scale
  hyperparameters.beta1 = step.beta1;
  hyperparameters.beta2 = step.beta2;
  hyperparameters.eps = step.eps;
  backend_for(parameter.device()).adamw_update(absl::Span<const AdamWTensorUpdate>(&update, 1), hyperparameters);
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParameterGroup> groups, const AdamWOptions& options) {
  return std::make_unique<AdamW>(std::move(groups), options);
}

}  // namespace weft
