// GeluMlp and SwigluMlp (mlp.h).
#include "layers/mlp.h"

#include <functional>
#include <utility>

#include "runtime/autograd/node.h"
#include "runtime/autograd/recompute.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/swiglu.h"
#include "runtime/ops/swiglu_linear.h"

namespace weft {

Tensor release_hidden_activation(const Tensor& projected, const Tensor& hidden) {
  if (hidden.grad_fn() == nullptr) return projected;  // no history: nothing saves it for a backward
  std::function<Tensor()> rebuild = autograd::output_rebuilder(hidden);
  WEFT_CHECK(rebuild != nullptr, "train.recompute selective: the MLP's hidden activation ", hidden.describe(),
             " came from ", hidden.grad_fn()->name(), ", which cannot compute it again; use train.recompute none or full");
  return autograd::release_until_backward(projected, hidden, std::move(rebuild));
}

int64_t swiglu_hidden_dim(int64_t dim, int64_t hidden_dim) {
  if (hidden_dim > 0) return hidden_dim;
  constexpr int64_t kMultiple = 64;
  const int64_t two_thirds_of_4c = 8 * dim / 3;
  return (two_thirds_of_4c + kMultiple - 1) / kMultiple * kMultiple;
}

int64_t mlp_hidden_width(const ModelConfig& config) {
  if (config.mlp == "swiglu_mlp" || config.type == "llama") return swiglu_hidden_dim(config.dim, config.hidden_dim);
  return config.hidden_dim > 0 ? config.hidden_dim : 4 * config.dim;
}

GeluMlp::GeluMlp(const LayerContext& context)
    : dim_(context.config.dim),
      hidden_dim_(context.config.hidden_dim > 0 ? context.config.hidden_dim : 4 * context.config.dim),
      release_hidden_(context.config.recompute == "selective"),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  fc_ = register_module("fc", std::make_shared<Linear>(dim_, hidden_dim_, config.bias, context));
  fc_->set_gelu();  // fc and GELU as one op (on CUDA, GELU in the GEMM's epilogue)
  projection_ = register_module(
      "proj", std::make_shared<Linear>(hidden_dim_, dim_, config.bias, context, residual_init_std(config)));
}

std::string GeluMlp::settings() const { return str(dim_, " -> ", hidden_dim_, " -> ", dim_); }

Tensor GeluMlp::forward(const Tensor& x) {
  const Tensor hidden = fc_->call(x);  // gelu(x fc^T + b) [..., hidden]
  return dropout_.apply(released_after(projection_->call(hidden), hidden), is_training());
}

Tensor GeluMlp::forward_adding(const Tensor& x, const Tensor& residual) {
  if (dropout_.probability() > 0.0 && is_training()) return add(residual, forward(x));
  const Tensor hidden = fc_->call(x);  // [..., hidden]
  return released_after(projection_->forward_adding(hidden, residual), hidden);
}

Tensor GeluMlp::released_after(const Tensor& projected, const Tensor& hidden) const {
  return release_hidden_ ? release_hidden_activation(projected, hidden) : projected;
}

SwigluMlp::SwigluMlp(const LayerContext& context)
    : dim_(context.config.dim),
      hidden_dim_(swiglu_hidden_dim(context.config.dim, context.config.hidden_dim)),
      release_hidden_(context.config.recompute == "selective"),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  gate_ = register_module("gate", std::make_shared<Linear>(dim_, hidden_dim_, config.bias, context));
  up_ = register_module("up", std::make_shared<Linear>(dim_, hidden_dim_, config.bias, context));
  down_ = register_module(
      "down", std::make_shared<Linear>(hidden_dim_, dim_, config.bias, context, residual_init_std(config)));
  // Without biases, gate and up run as one op whose backward writes both weight gradients with one
  // product where their .grad lie next to each other (runtime/ops/swiglu_linear.h).
  if (!config.bias) keep_gradients_adjacent({"gate.weight", "up.weight"});
}

std::string SwigluMlp::settings() const { return str(dim_, " -> 2 x ", hidden_dim_, " -> ", dim_); }

Tensor SwigluMlp::hidden_activation(const Tensor& x) {
  // One op for both products and the activation unless a bias or a tensor-parallel plan's wrapper
  // around gate or up asks for each layer's own call.
  if (!gate_->bias().defined() && !up_->bias().defined() && !gate_->has_forward_wrapper() &&
      !up_->has_forward_wrapper()) {
    return swiglu_linear(x, gate_->weight(), up_->weight());
  }
  return swiglu(gate_->call(x), up_->call(x));  // silu(gate) * up, one op
}

Tensor SwigluMlp::forward(const Tensor& x) {
  const Tensor hidden = hidden_activation(x);  // [..., hidden]
  return dropout_.apply(released_after(down_->call(hidden), hidden), is_training());
}

Tensor SwigluMlp::forward_adding(const Tensor& x, const Tensor& residual) {
  if (dropout_.probability() > 0.0 && is_training()) return add(residual, forward(x));
  const Tensor hidden = hidden_activation(x);  // [..., hidden]
  return released_after(down_->forward_adding(hidden, residual), hidden);
}

Tensor SwigluMlp::released_after(const Tensor& projected, const Tensor& hidden) const {
  return release_hidden_ ? release_hidden_activation(projected, hidden) : projected;
}

std::vector<ParallelPlanEntry> GeluMlp::tensor_parallel_plan() const {
  return {{"fc", ParallelStyle::kColumn, {}}, {"proj", ParallelStyle::kRow, {}}, {"", ParallelStyle::kSequence, {}}};
}

std::vector<ParallelPlanEntry> SwigluMlp::tensor_parallel_plan() const {
  return {{"gate", ParallelStyle::kColumn, {}},
          {"up", ParallelStyle::kColumn, {}},
          {"down", ParallelStyle::kRow, {}},
          {"", ParallelStyle::kSequence, {}}};
}

WEFT_REGISTER_LAYER("gelu_mlp", [](const LayerContext& context) { return std::make_shared<GeluMlp>(context); });
WEFT_REGISTER_LAYER("swiglu_mlp", [](const LayerContext& context) { return std::make_shared<SwigluMlp>(context); });

}  // namespace weft
