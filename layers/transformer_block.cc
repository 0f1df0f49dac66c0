// TransformerBlock (transformer_block.h).
#include "layers/transformer_block.h"

#include <typeinfo>

#include "layers/layer_norm.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/normalization.h"

namespace weft {

TransformerBlock::TransformerBlock(const LayerContext& context) {
  const LayerRegistry& registry = LayerRegistry::global();
  norm1_ = register_module("norm1", registry.create(context.config.norm, context));
  attention_ = register_module("attention", std::make_shared<CausalSelfAttention>(context));
  norm2_ = register_module("norm2", registry.create(context.config.norm, context));
  mlp_ = register_module("mlp", registry.create(context.config.mlp, context));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor attention_out = attention_->call(norm1_->call(x));  // [B, T, C]
  // config.norm "layer_norm" (not a subclass with its own forward, nor wrapped by a plan).
  if (typeid(*norm2_) == typeid(LayerNorm) && !norm2_->has_forward_wrapper()) {
    // The residual add and the second layer norm as one op (one pass over the stream on CUDA).
    const auto* norm2 = static_cast<const LayerNorm*>(norm2_.get());
    auto [attended, normalized] = add_layer_norm(x, attention_out, norm2->weight(), norm2->bias(), norm2->eps());
    return add(attended, mlp_->call(normalized));  // [B, T, C]
  }
  const Tensor attended = add(x, attention_out);                   // [B, T, C]
  return add(attended, mlp_->call(norm2_->call(attended)));  // [B, T, C]
}

WEFT_REGISTER_LAYER("transformer_block",
                    [](const LayerContext& context) { return std::make_shared<TransformerBlock>(context); });

}  // namespace weft
