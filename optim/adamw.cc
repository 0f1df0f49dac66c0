// AdamW: the optimizer (state, groups, checkpoint) and its per-parameter update (adamw.h).
#include "optim/adamw.h"

#include <cmath>
#include <string>
#include <utility>

#include "optim/master_weights.h"
#include "optim/optimizer.h"
#include "runtime/error.h"
#if defined(WEFT_HAVE_CUDA)
#include "runtime/cuda/optimizer_kernels.h"
#endif

namespace weft {
namespace {

// One parameter's update on the CPU. Parameter is the storage type, State float or double; grad,
// exp_avg, exp_avg_sq are State; master is null unless Parameter is 16-bit. The per-step scalars
// are computed in double and rounded once to State, as PyTorch passes Python floats to its kernels.
template <class Parameter, class State>
void adamw_update_cpu(Parameter* parameter, const State* grad, State* exp_avg, State* exp_avg_sq, State* master,
                      int64_t count, const AdamWStep& step) {
  const double bias_correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
  const double bias_correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
  const State decay = static_cast<State>(1.0 - step.lr * step.weight_decay);
  const State beta1 = static_cast<State>(step.beta1);
  const State one_minus_beta1 = static_cast<State>(1.0 - step.beta1);
  const State beta2 = static_cast<State>(step.beta2);
  const State one_minus_beta2 = static_cast<State>(1.0 - step.beta2);
  const State step_size = static_cast<State>(step.lr / bias_correction1);
  const State bias_correction2_sqrt = static_cast<State>(std::sqrt(bias_correction2));
  const State eps = static_cast<State>(step.eps);
  for (int64_t i = 0; i < count; ++i) {
    State value = load_parameter_value(parameter, master, i);
    const State g = grad[i];
    value = value * decay;
    exp_avg[i] = exp_avg[i] * beta1 + g * one_minus_beta1;
    exp_avg_sq[i] = exp_avg_sq[i] * beta2 + g * g * one_minus_beta2;
    const State denominator = std::sqrt(exp_avg_sq[i]) / bias_correction2_sqrt + eps;
    value = value - step_size * (exp_avg[i] / denominator);
    store_parameter_value(parameter, master, i, value);
  }
}

#if defined(WEFT_HAVE_CUDA)
// The scalars of one update, as the CPU loop derives them.
cuda::AdamWTensorUpdate cuda_update(const Tensor& parameter, const Tensor& grad, const Tensor& exp_avg,
                                    const Tensor& exp_avg_sq, const Tensor& master, const AdamWStep& step) {
  const double bias_correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
  const double bias_correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
  return cuda::AdamWTensorUpdate{.parameter = parameter,
                                 .grad = grad.contiguous(),
                                 .exp_avg = exp_avg,
                                 .exp_avg_sq = exp_avg_sq,
                                 .master = master,
                                 .step_size = step.lr / bias_correction1,
                                 .bias_correction2_sqrt = std::sqrt(bias_correction2),
                                 .decay = 1.0 - step.lr * step.weight_decay};
}
#endif

template <class Parameter, class State>
void adamw_update_cpu_typed(const Tensor& parameter, const Tensor& grad, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq, const Tensor& master, const AdamWStep& step) {
  adamw_update_cpu<Parameter, State>(parameter.data<Parameter>(), grad.data<State>(), exp_avg.data<State>(),
                                     exp_avg_sq.data<State>(), master.defined() ? master.data<State>() : nullptr,
                                     parameter.numel(), step);
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
        if (state.master.defined()) register_state(parameter.name + ".master", state.master);
        states_.push_back(std::move(state));
      }
    }
  }

  void step(double lr) override {
    WEFT_CHECK(std::isfinite(lr) && lr >= 0.0, "adamw: lr must be finite and >= 0, got ", lr);
#if defined(WEFT_HAVE_CUDA)
    std::vector<cuda::AdamWTensorUpdate> device_updates;  // all CUDA parameters: one launch
#endif
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
#if defined(WEFT_HAVE_CUDA)
        if (parameter.tensor.device().is_cuda()) {
          device_updates.push_back(
              cuda_update(parameter.tensor, grad, state.exp_avg, state.exp_avg_sq, state.master, scalars));
          count += 1;
          continue;
        }
#endif
        adamw_update(parameter.tensor, grad, state.exp_avg, state.exp_avg_sq, state.master, scalars);
        count += 1;
      }
    }
#if defined(WEFT_HAVE_CUDA)
    cuda::adamw_multi_tensor(device_updates, options_.beta1, options_.beta2, options_.eps);
#endif
    steps_ += 1;
  }

  std::map<std::string, Tensor> state_dict() const override { return snapshot_state(); }
  void load_state_dict(const std::map<std::string, Tensor>& state) override { restore_state(state); }

 private:
  struct State {
    Tensor exp_avg;     // parameter's shape, state dtype
    Tensor exp_avg_sq;  // parameter's shape, state dtype
    Tensor master;      // f32 copy for a bf16/f16 parameter, undefined otherwise
    Tensor step;        // i64 scalar, CPU: updates applied to this parameter
  };
  AdamWOptions options_;
  std::vector<State> states_;  // one per parameter, in group order
};

}  // namespace

void adamw_update(const Tensor& parameter, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                  const Tensor& master, const AdamWStep& step) {
  WEFT_CHECK(step.step >= 1, "adamw_update: step must be >= 1, got ", step.step);
  if (!parameter.device().is_cpu()) {
#if defined(WEFT_HAVE_CUDA)
    cuda::adamw_multi_tensor({cuda_update(parameter, grad, exp_avg, exp_avg_sq, master, step)}, step.beta1,
                             step.beta2, step.eps);
    return;
#else
    WEFT_FAIL("adamw_update: parameter ", parameter.describe(), " is on ", parameter.device().to_string(),
              ", but this build of weft has no CUDA backend");
#endif
  }
  const Tensor gradient = gradient_in_state_dtype(parameter, grad, "adamw_update");
  const DType state_dtype = optimizer_state_dtype(parameter.dtype());
  for (const Tensor* state : {&exp_avg, &exp_avg_sq}) {
    WEFT_CHECK(state->shape() == parameter.shape() && state->dtype() == state_dtype && state->is_contiguous() &&
                   state->device() == parameter.device(),
               "adamw_update: state ", state->describe(), " does not fit parameter ", parameter.describe());
  }
  WEFT_CHECK(parameter.is_contiguous(), "adamw_update: parameter ", parameter.describe(), " is not contiguous");
  check_master_weights(parameter, master, "adamw_update");
  switch (parameter.dtype()) {
    case kFloat32:
      return adamw_update_cpu_typed<float, float>(parameter, gradient, exp_avg, exp_avg_sq, master, step);
    case kFloat64:
      return adamw_update_cpu_typed<double, double>(parameter, gradient, exp_avg, exp_avg_sq, master, step);
    case kBFloat16:
      return adamw_update_cpu_typed<BFloat16, float>(parameter, gradient, exp_avg, exp_avg_sq, master, step);
    case kFloat16:
      return adamw_update_cpu_typed<Float16, float>(parameter, gradient, exp_avg, exp_avg_sq, master, step);
    default:
      WEFT_FAIL("adamw_update: parameter ", parameter.describe(), " is not floating");
  }
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParameterGroup> groups, const AdamWOptions& options) {
  return std::make_unique<AdamW>(std::move(groups), options);
}

}  // namespace weft
