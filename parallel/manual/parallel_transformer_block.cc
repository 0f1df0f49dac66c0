// ParallelTransformerBlock (parallel_transformer_block.h).
#include "parallel/manual/parallel_transformer_block.h"

#include <typeinfo>

#include "layers/layer_norm.h"
#include "layers/transformer_block.h"
#include "parallel/manual/parallel_mlp.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/normalization.h"

namespace weft {

void mark_partial_gradients(Module& module) {
  for (const NamedParameter& parameter : module.named_parameters()) {
    if (parameter.name.find('.') == std::string::npos) module.mark_partial_gradient(parameter.name);
  }
  for (const auto& [name, child] : module.children()) mark_partial_gradients(*child);
}

ParallelTransformerBlock::ParallelTransformerBlock(const LayerContext& context, const TensorParallelGroup& tp,
                                                   bool sequence_parallel)
    : recompute_full_(context.config.recompute == "full") {
  const LayerRegistry& registry = LayerRegistry::global();
  norm1_ = register_module("norm1", registry.create(context.config.norm, context));
  attention_ = register_module("attention", std::make_shared<ParallelAttention>(context, tp, sequence_parallel));
  norm2_ = register_module("norm2", registry.create(context.config.norm, context));
  mlp_ = register_module("mlp", make_parallel_mlp(context, tp, sequence_parallel));
  if (sequence_parallel) {
    mark_partial_gradients(*norm1_);
    mark_partial_gradients(*norm2_);
  }
}

Tensor ParallelTransformerBlock::forward(const Tensor& x) {
  if (!recompute_full_) return compute(x);
  return recompute_module(*this, [this](const Tensor& input) { return compute(input); }, x);
}

Tensor ParallelTransformerBlock::compute(const Tensor& x) {
  const Tensor attention_out = attention_->call(norm1_->call(x));  // [B, T, C]
  if (typeid(*norm2_) == typeid(LayerNorm)) {  // as TransformerBlock: the residual add and norm2 as one op
    const auto* norm2 = static_cast<const LayerNorm*>(norm2_.get());
    auto [attended, normalized] = add_layer_norm(x, attention_out, norm2->weight(), norm2->bias(), norm2->eps());
    return add(attended, mlp_->call(normalized));  // [B, T, C]
  }
  const Tensor attended = add(x, attention_out);                   // [B, T, C]
  return add(attended, mlp_->call(norm2_->call(attended)));        // [B, T, C]
}

}  // namespace weft
