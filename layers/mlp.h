// The transformer's feed-forward layers, created by name from config.mlp.
//
// GeluMlp ("gelu_mlp", GPT-2):  x [B, T, C] -> fc [hidden, C] -> gelu (tanh form) -> proj [C, hidden]
//   hidden = config.hidden_dim, or 4C when 0.
// SwigluMlp ("swiglu_mlp", Llama): silu(x Wgate^T) * (x Wup^T) -> down [C, hidden]
//   gate, up [hidden, C]; hidden = config.hidden_dim, or 8C/3 rounded up to a multiple of 64 when 0
//   (Llama's rule, which keeps the parameter count near the 4C GELU MLP's and the matmuls aligned).
//   Without biases, gate, up and the activation are one op (swiglu_linear), and the two weights'
//   gradients are kept next to each other in a gradient buffer so that one product writes both.
// Tensor parallelism (auto mode): the first matmuls column-wise, the output projection row-wise,
// the output (dropout) sequence-split under sequence parallelism; the hidden width is read from
// the weights, so a shard computes with its part of it.
// Both: biases per config.bias; the output projection is drawn with init_std / sqrt(2 * layers)
// (GPT-2's residual scaling); dropout (config.dropout) on the output in training only. With
// config.recompute selective, the hidden activation is freed after the output projection has read it
// and rebuilt in backward (runtime/autograd/recompute.h's release_until_backward) by the op that made
// it, from the tensors that op keeps for its own backward (output_rebuilder): GELU of fc's saved
// pre-activation, SwiGLU of its saved gate and up. No product reruns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/dropout_stream.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

// round_up(8C/3, 64) unless hidden_dim > 0.
int64_t swiglu_hidden_dim(int64_t dim, int64_t hidden_dim);
// The MLP width of a built-in model: swiglu_hidden_dim for SwiGLU (model.mlp swiglu_mlp, or a
// Llama), otherwise model.hidden_dim or 4C.
int64_t mlp_hidden_width(const ModelConfig& config);
// train.recompute selective: `projected` (the output projection's output) returned so that
// `hidden` (the MLP's widest activation, which only that projection saves) is freed now and
// computed again in backward by the op that made it, from what that op keeps for its own backward
// anyway (output_rebuilder: GELU's pre-activation, SwiGLU's gate and up): no product reruns, one
// elementwise pass. `projected` itself when hidden has no history.
Tensor release_hidden_activation(const Tensor& projected, const Tensor& hidden);

class GeluMlp : public Module {
 public:
  explicit GeluMlp(const LayerContext& context);

  std::string type_name() const override { return "GeluMlp"; }
  std::string settings() const override;
  // x [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override;
  // residual + forward(x), the add inside the output projection's product (LinearLayer::
  // forward_adding) where nothing comes between them (no dropout in training); else the plain add.
  // The residual stream's step of a TransformerBlock.
  Tensor forward_adding(const Tensor& x, const Tensor& residual);
  std::vector<ParallelPlanEntry> tensor_parallel_plan() const override;
  int64_t hidden_dim() const { return hidden_dim_; }

 private:
  // `projected` (the output projection's output), through release_hidden_activation when selective.
  Tensor released_after(const Tensor& projected, const Tensor& hidden) const;

  int64_t dim_;
  int64_t hidden_dim_;
  bool release_hidden_;                 // config.recompute == "selective"
  std::shared_ptr<Linear> fc_;          // [hidden, C]
  std::shared_ptr<Linear> projection_;  // [C, hidden]
  DropoutStream dropout_;
};

class SwigluMlp : public Module {
 public:
  explicit SwigluMlp(const LayerContext& context);

  std::string type_name() const override { return "SwigluMlp"; }
  std::string settings() const override;
  // x [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override;
  // As GeluMlp::forward_adding.
  Tensor forward_adding(const Tensor& x, const Tensor& residual);
  std::vector<ParallelPlanEntry> tensor_parallel_plan() const override;
  int64_t hidden_dim() const { return hidden_dim_; }

 private:
  // silu(x Wgate^T) * (x Wup^T) [..., hidden]: swiglu_linear (one op, the weight gradients in one
  // product) when neither layer has a bias or a plan's wrapper, otherwise each layer's call and swiglu.
  Tensor hidden_activation(const Tensor& x);
  // As GeluMlp's.
  Tensor released_after(const Tensor& projected, const Tensor& hidden) const;

  int64_t dim_;
  int64_t hidden_dim_;
  bool release_hidden_;           // config.recompute == "selective"
  std::shared_ptr<Linear> gate_;  // [hidden, C]
  std::shared_ptr<Linear> up_;    // [hidden, C]
  std::shared_ptr<Linear> down_;  // [C, hidden]
  DropoutStream dropout_;
};

}  // namespace weft
