// RmsNorm (rms_norm.h).
#include "layers/rms_norm.h"

#include "layers/registry.h"
#include "runtime/error.h"
#include "runtime/ops/normalization.h"

namespace weft {

RmsNorm::RmsNorm(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  WEFT_CHECK(dim >= 1, "RmsNorm: dim must be positive, got ", dim);
  register_parameter("weight", Tensor::ones({dim}));
}

std::string RmsNorm::settings() const { return str(dim_, ", eps ", eps_); }

Tensor RmsNorm::forward(const Tensor& x) { return rms_norm(x, weight(), eps_); }

WEFT_REGISTER_LAYER("rms_norm", [](const LayerContext& context) {
  return std::make_shared<RmsNorm>(context.config.dim, context.config.norm_eps);
});

}  // namespace weft
