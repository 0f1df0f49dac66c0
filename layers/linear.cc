// Linear (linear.h).
#include "layers/linear.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"

namespace weft {

double residual_init_std(const ModelConfig& config) {
  return config.init_std / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(config.layers, 1)));
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context)
    : Linear(in_features, out_features, bias, context, context.config.init_std) {}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context, double init_std)
    : in_features_(in_features), out_features_(out_features), has_bias_(bias) {
  WEFT_CHECK(in_features >= 1 && out_features >= 1, "Linear: sizes must be positive, got ", in_features, " -> ",
             out_features);
  const uint64_t count = static_cast<uint64_t>(in_features * out_features);
  register_parameter("weight", Tensor::normal({out_features, in_features}, context.config.seed,
                                              context.next_offset(count), 0.0, init_std));
  if (bias) register_parameter("bias", Tensor::zeros({out_features}));
}

std::string Linear::settings() const {
  return str(in_features_, " -> ", out_features_, has_bias_ ? ", bias" : "");
}

Tensor Linear::bias() const { return has_bias_ ? parameter("bias") : Tensor(); }

Tensor LinearLayer::forward(const Tensor& x) {
  return gelu_ ? linear_gelu(x, weight(), bias()) : linear(x, weight(), bias());
}

Tensor LinearLayer::forward_adding(const Tensor& x, const Tensor& residual) {
  if (gelu_ || has_forward_wrapper()) return add(residual, call(x));
  return linear_add(x, weight(), bias(), residual);
}

}  // namespace weft
