// SquaredReluMlp ("squared_relu_mlp"): Primer's feed-forward layer, a custom layer outside weft.
//
//   x [B, T, C] -> up [hidden, C] -> squared_relu -> down [C, hidden] -> [B, T, C]
//
// Built like weft's own GeluMlp (layers/mlp.h), from the same LayerContext: hidden = config.hidden_dim,
// or 4C when 0; biases per config.bias; `down` writes into the residual stream, so it is drawn with
// residual_init_std(config); dropout (config.dropout) on the output in training only. One setting
// of its own comes from the model section's options:
//   model.options.squared_relu_scale   the activation's factor (default 1)
// Selected in a config with `model.mlp: squared_relu_mlp`; every transformer block then uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/dropout_stream.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/registry.h"

namespace weft_example {

class SquaredReluMlp : public weft::Module {
 public:
  explicit SquaredReluMlp(const weft::LayerContext& context);

  std::string type_name() const override { return "SquaredReluMlp"; }
  std::string settings() const override;
  // x [..., C] -> [..., C]
  weft::Tensor forward(const weft::Tensor& x) override;
  int64_t hidden_dim() const { return hidden_dim_; }
  double activation_scale() const { return activation_scale_; }

 private:
  int64_t dim_;
  int64_t hidden_dim_;
  double activation_scale_;
  std::shared_ptr<weft::Linear> up_;    // [hidden, C]
  std::shared_ptr<weft::Linear> down_;  // [C, hidden]
  weft::DropoutStream dropout_;
};

}  // namespace weft_example
