// TransformerBlock (transformer_block.h).
#include "layers/transformer_block.h"

#include "runtime/ops/elementwise.h"

namespace weft {

TransformerBlock::TransformerBlock(const LayerContext& context) {
  const LayerRegistry& registry = LayerRegistry::global();
  norm1_ = register_module("norm1", registry.create(context.config.norm, context));
  attention_ = register_module("attention", std::make_shared<CausalSelfAttention>(context));
  norm2_ = register_module("norm2", registry.create(context.config.norm, context));
  mlp_ = register_module("mlp", registry.create(context.config.mlp, context));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor attended = add(x, attention_->forward(norm1_->forward(x)));  // [B, T, C]
  return add(attended, mlp_->forward(norm2_->forward(attended)));           // [B, T, C]
}

WEFT_REGISTER_LAYER("transformer_block",
                    [](const LayerContext& context) { return std::make_shared<TransformerBlock>(context); });

}  // namespace weft
