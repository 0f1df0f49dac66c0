// SGD with momentum: the optimizer (state, groups, checkpoint) and its per-parameter update (sgd.h).
#include "optim/sgd.h"

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

// One parameter's update on the CPU; buffer is null when momentum is 0, master null unless
// Parameter is 16-bit. Scalars are rounded once to State, as PyTorch passes Python floats.
template <class Parameter, class State>
void sgd_update_cpu(Parameter* parameter, const State* grad, State* buffer, State* master, int64_t count,
                    const SgdStep& step) {
  const State lr = static_cast<State>(step.lr);
  const State momentum = static_cast<State>(step.momentum);
  const State weight_decay = static_cast<State>(step.weight_decay);
  for (int64_t i = 0; i < count; ++i) {
    State value = load_parameter_value(parameter, master, i);
    State direction = grad[i];
    if (step.weight_decay != 0.0) direction = direction + weight_decay * value;
    if (buffer != nullptr) {
      buffer[i] = momentum * buffer[i] + direction;
      direction = step.nesterov ? direction + momentum * buffer[i] : buffer[i];
    }
    value = value - lr * direction;
    store_parameter_value(parameter, master, i, value);
  }
}

template <class Parameter, class State>
void sgd_update_cpu_typed(const Tensor& parameter, const Tensor& grad, const Tensor& buffer, const Tensor& master,
                          const SgdStep& step) {
  sgd_update_cpu<Parameter, State>(parameter.data<Parameter>(), grad.data<State>(),
                                   buffer.defined() ? buffer.data<State>() : nullptr,
                                   master.defined() ? master.data<State>() : nullptr, parameter.numel(), step);
}

#if defined(WEFT_HAVE_CUDA)
cuda::SgdTensorUpdate cuda_update(const Tensor& parameter, const Tensor& grad, const Tensor& momentum_buffer,
                                  const Tensor& master, const SgdStep& step) {
  return cuda::SgdTensorUpdate{.parameter = parameter,
                               .grad = grad.contiguous(),
                               .momentum_buffer = momentum_buffer,
                               .master = master,
                               .lr = step.lr,
                               .weight_decay = step.weight_decay};
}
#endif

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
        if (state.master.defined()) register_state(parameter.name + ".master", state.master);
        states_.push_back(std::move(state));
      }
    }
  }

  void step(double lr) override {
    WEFT_CHECK(std::isfinite(lr) && lr >= 0.0, "sgd: lr must be finite and >= 0, got ", lr);
#if defined(WEFT_HAVE_CUDA)
    std::vector<cuda::SgdTensorUpdate> device_updates;  // all CUDA parameters: one launch
#endif
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
#if defined(WEFT_HAVE_CUDA)
        if (parameter.tensor.device().is_cuda()) {
          device_updates.push_back(cuda_update(parameter.tensor, grad, state.momentum_buffer, state.master, scalars));
          continue;
        }
#endif
        sgd_update(parameter.tensor, grad, state.momentum_buffer, state.master, scalars);
      }
    }
#if defined(WEFT_HAVE_CUDA)
    cuda::sgd_multi_tensor(device_updates, options_.momentum, options_.nesterov);
#endif
    steps_ += 1;
  }

  std::map<std::string, Tensor> state_dict() const override { return snapshot_state(); }
  void load_state_dict(const std::map<std::string, Tensor>& state) override { restore_state(state); }

 private:
  struct State {
    Tensor momentum_buffer;  // parameter's shape, state dtype; undefined when momentum is 0
    Tensor master;           // f32 copy for a bf16/f16 parameter, undefined otherwise
  };
  SgdOptions options_;
  std::vector<State> states_;  // one per parameter, in group order
};

}  // namespace

void sgd_update(const Tensor& parameter, const Tensor& grad, const Tensor& momentum_buffer, const Tensor& master,
                const SgdStep& step) {
  if (!parameter.device().is_cpu()) {
#if defined(WEFT_HAVE_CUDA)
    cuda::sgd_multi_tensor({cuda_update(parameter, grad, momentum_buffer, master, step)}, step.momentum,
                           step.nesterov);
    return;
#else
    WEFT_FAIL("sgd_update: parameter ", parameter.describe(), " is on ", parameter.device().to_string(),
              ", but this build of weft has no CUDA backend");
#endif
  }
  const Tensor gradient = gradient_in_state_dtype(parameter, grad, "sgd_update");
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
  switch (parameter.dtype()) {
    case kFloat32: return sgd_update_cpu_typed<float, float>(parameter, gradient, momentum_buffer, master, step);
    case kFloat64: return sgd_update_cpu_typed<double, double>(parameter, gradient, momentum_buffer, master, step);
    case kBFloat16: return sgd_update_cpu_typed<BFloat16, float>(parameter, gradient, momentum_buffer, master, step);
    case kFloat16: return sgd_update_cpu_typed<Float16, float>(parameter, gradient, momentum_buffer, master, step);
    default: WEFT_FAIL("sgd_update: parameter ", parameter.describe(), " is not floating");
  }
}

std::unique_ptr<Optimizer> make_sgd(std::vector<ParameterGroup> groups, const SgdOptions& options) {
  return std::make_unique<Sgd>(std::move(groups), options);
}

}  // namespace weft
