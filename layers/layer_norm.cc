// LayerNorm (layer_norm.h).
#include "layers/layer_norm.h"

#include "layers/registry.h"
#include "runtime/error.h"
#include "runtime/ops/normalization.h"

namespace weft {

LayerNorm::LayerNorm(int64_t dim, double eps, bool bias) : dim_(dim), eps_(eps), has_bias_(bias) {
  WEFT_CHECK(dim >= 1, "LayerNorm: dim must be positive, got ", dim);
  register_parameter("weight", Tensor::ones({dim}));
  if (bias) register_parameter("bias", Tensor::zeros({dim}));
}

std::string LayerNorm::settings() const { return str(dim_, ", eps ", eps_, has_bias_ ? ", bias" : ""); }

Tensor LayerNorm::bias() const { return has_bias_ ? parameter("bias") : Tensor(); }

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight(), bias(), eps_); }

WEFT_REGISTER_LAYER("layer_norm", [](const LayerContext& context) {
  return std::make_shared<LayerNorm>(context.config.dim, context.config.norm_eps, context.config.bias);
});

}  // namespace weft
