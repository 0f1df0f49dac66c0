// ParallelGeluMlp and ParallelSwigluMlp (parallel_mlp.h).
#include "parallel/manual/parallel_mlp.h"

#include "layers/linear.h"
#include "layers/mlp.h"
#include "runtime/autograd/recompute.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"

namespace weft {

ParallelGeluMlp::ParallelGeluMlp(const LayerContext& context, const TensorParallelGroup& tp, bool sequence_parallel)
    : release_hidden_(context.config.recompute == "selective"),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  const int64_t hidden = mlp_hidden_width(config);
  fc_ = register_module("fc", std::make_shared<ColumnParallelLinear>(config.dim, hidden, config.bias, context,
                                                                     config.init_std, tp, sequence_parallel));
  projection_ = register_module("proj", std::make_shared<RowParallelLinear>(hidden, config.dim, config.bias, context,
                                                                            residual_init_std(config), tp,
                                                                            sequence_parallel));
}

Tensor ParallelGeluMlp::forward(const Tensor& x) {
  // fc and GELU as one op, as GeluMlp does (on CUDA the bias and GELU ride the GEMM's epilogue);
  // under train.recompute selective the hidden is rebuilt from its pre-activation in backward, as
  // GeluMlp's is. No collective runs again.
  const Tensor hidden = linear_gelu(fc_->input_region(x), fc_->weight(), fc_->bias());  // [B, T, hidden/N]
  const Tensor projected = projection_->forward(hidden);
  return dropout_.apply(release_hidden_ ? release_hidden_activation(projected, hidden) : projected, is_training());
}

ParallelSwigluMlp::ParallelSwigluMlp(const LayerContext& context, const TensorParallelGroup& tp,
                                     bool sequence_parallel)
    : release_hidden_(context.config.recompute == "selective"),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  const int64_t hidden = mlp_hidden_width(config);
  gate_ = register_module("gate", std::make_shared<ColumnParallelLinear>(config.dim, hidden, config.bias, context,
                                                                         config.init_std, tp, sequence_parallel));
  up_ = register_module("up", std::make_shared<ColumnParallelLinear>(config.dim, hidden, config.bias, context,
                                                                     config.init_std, tp, sequence_parallel));
  down_ = register_module("down", std::make_shared<RowParallelLinear>(hidden, config.dim, config.bias, context,
                                                                      residual_init_std(config), tp,
                                                                      sequence_parallel));
}

Tensor ParallelSwigluMlp::forward(const Tensor& x) {
  const Tensor input = gate_->input_region(x);  // gathered (its gradient reduced) once for both projections
  const Tensor gate = gate_->local_forward(input), up = up_->local_forward(input);  // [B, T, hidden/N]
  const auto activation = [](const Tensor& gate, const Tensor& up) { return mul(silu(gate), up); };
  const Tensor hidden = activation(gate, up);  // [B, T, hidden/N]
  if (!release_hidden_) return dropout_.apply(down_->forward(hidden), is_training());
  // train.recompute selective: freed once down has read it, rebuilt from gate and up for down's backward.
  const Tensor out =
      autograd::release_until_backward(down_->forward(hidden), hidden, [=] { return activation(gate, up); });
  return dropout_.apply(out, is_training());
}

void check_parallel_mlp(const ModelConfig& config) {
  WEFT_CHECK(config.mlp == "gelu_mlp" || config.mlp == "swiglu_mlp", "model.mlp = '", config.mlp,
             "' has no tensor-parallel version in comm.mode: manual, which has gelu_mlp and swiglu_mlp only; use "
             "comm.mode: auto, which parallelizes a layer from its declared layout");
}

std::shared_ptr<Module> make_parallel_mlp(const LayerContext& context, const TensorParallelGroup& tp,
                                          bool sequence_parallel) {
  check_parallel_mlp(context.config);
  if (context.config.mlp == "gelu_mlp") return std::make_shared<ParallelGeluMlp>(context, tp, sequence_parallel);
  return std::make_shared<ParallelSwigluMlp>(context, tp, sequence_parallel);
}

}  // namespace weft
