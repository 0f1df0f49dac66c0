// SquaredReluMlp (squared_relu_mlp.h) and its registration as "squared_relu_mlp".
#include "squared_relu_mlp.h"

#include <cmath>
#include <exception>

#include "runtime/error.h"
#include "squared_relu.h"

namespace weft_example {
namespace {

// model.options.squared_relu_scale, or 1 when the config does not set it.
double activation_scale_option(const weft::ModelConfig& config) {
  const auto found = config.options.find("squared_relu_scale");
  if (found == config.options.end()) return 1.0;
  double value = 0;
  size_t parsed = 0;
  try {
    value = std::stod(found->second, &parsed);
  } catch (const std::exception&) {
    parsed = 0;
  }
  WEFT_CHECK(parsed == found->second.size() && std::isfinite(value) && value > 0,
             "model.options.squared_relu_scale: expected a positive number, got '", found->second, "'");
  return value;
}

}  // namespace

SquaredReluMlp::SquaredReluMlp(const weft::LayerContext& context)
    : dim_(context.config.dim),
      hidden_dim_(context.config.hidden_dim > 0 ? context.config.hidden_dim : 4 * context.config.dim),
      activation_scale_(activation_scale_option(context.config)),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const weft::ModelConfig& config = context.config;
  up_ = register_module("up", std::make_shared<weft::Linear>(dim_, hidden_dim_, config.bias, context));
  down_ = register_module("down", std::make_shared<weft::Linear>(hidden_dim_, dim_, config.bias, context,
                                                                  weft::residual_init_std(config)));
}

std::string SquaredReluMlp::settings() const {
  return weft::str(dim_, " -> ", hidden_dim_, " -> ", dim_, ", relu^2 x ", activation_scale_);
}

weft::Tensor SquaredReluMlp::forward(const weft::Tensor& x) {
  const weft::Tensor hidden = squared_relu(up_->call(x), activation_scale_);  // [..., hidden]
  return dropout_.apply(down_->call(hidden), is_training());
}

WEFT_REGISTER_LAYER("squared_relu_mlp",
                    [](const weft::LayerContext& context) { return std::make_shared<SquaredReluMlp>(context); });

}  // namespace weft_example
