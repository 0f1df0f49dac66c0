// TransformerBlock (transformer_block.h).
#include "layers/transformer_block.h"

#include <map>
#include <typeinfo>

#include "layers/layer_norm.h"
#include "layers/mlp.h"
#include "layers/rms_norm.h"
#include "runtime/autograd/recompute.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/normalization.h"

namespace weft {

TransformerBlock::TransformerBlock(const LayerContext& context) : recompute_full_(context.config.recompute == "full") {
  const LayerRegistry& registry = LayerRegistry::global();
  norm1_ = register_module("norm1", registry.create(context.config.norm, context));
  attention_ = register_module("attention", std::make_shared<CausalSelfAttention>(context));
  norm2_ = register_module("norm2", registry.create(context.config.norm, context));
  mlp_ = register_module("mlp", registry.create(context.config.mlp, context));
}

std::string TransformerBlock::settings() const { return recompute_full_ ? "recompute full" : ""; }

Tensor TransformerBlock::forward(const Tensor& x) {
  if (!recompute_full_) return compute(x);
  return recompute_module(*this, [this](const Tensor& input) { return compute(input); }, x);
}

Tensor TransformerBlock::compute(const Tensor& x) {
  const Tensor attention_out = attention_->call(norm1_->call(x));  // [B, T, C]
  // config.norm "layer_norm" or "rms_norm" (not a subclass with its own forward, nor wrapped by a
  // plan): the residual add and the second norm as one op (one pass over the stream on CUDA).
  if (typeid(*norm2_) == typeid(LayerNorm) && !norm2_->has_forward_wrapper()) {
    const auto* norm2 = static_cast<const LayerNorm*>(norm2_.get());
    auto [attended, normalized] = add_layer_norm(x, attention_out, norm2->weight(), norm2->bias(), norm2->eps());
    return mlp_adding(normalized, attended);  // [B, T, C]
  }
  if (typeid(*norm2_) == typeid(RmsNorm) && !norm2_->has_forward_wrapper()) {
    const auto* norm2 = static_cast<const RmsNorm*>(norm2_.get());
    auto [attended, normalized] = add_rms_norm(x, attention_out, norm2->weight(), norm2->eps());
    return mlp_adding(normalized, attended);  // [B, T, C]
  }
  const Tensor attended = add(x, attention_out);  // [B, T, C]
  return mlp_adding(norm2_->call(attended), attended);
}

Tensor TransformerBlock::mlp_adding(const Tensor& normalized, const Tensor& residual) {
  // The built-in MLPs (not a subclass with its own forward, nor wrapped by a plan) add the residual
  // in their output projection's product: one pass over the stream fewer (CUDA: the GEMM reads it).
  if (!mlp_->has_forward_wrapper()) {
    if (typeid(*mlp_) == typeid(GeluMlp)) return static_cast<GeluMlp*>(mlp_.get())->forward_adding(normalized, residual);
    if (typeid(*mlp_) == typeid(SwigluMlp)) {
      return static_cast<SwigluMlp*>(mlp_.get())->forward_adding(normalized, residual);
    }
  }
  return add(residual, mlp_->call(normalized));
}

Tensor recompute_module(Module& module, const std::function<Tensor(const Tensor&)>& function, const Tensor& x) {
  // The module's dropout counters in random_state()'s (name) order: the rerun draws the masks the
  // first run drew.
  autograd::ReplayedCounters counters;
  counters.read = [&module] {
    std::vector<uint64_t> offsets;
    for (const auto& [name, offset] : module.random_state()) offsets.push_back(offset);
    return offsets;
  };
  counters.write = [&module](const std::vector<uint64_t>& offsets) {
    std::map<std::string, uint64_t> state = module.random_state();
    size_t index = 0;
    for (auto& [name, offset] : state) offset = offsets[index++];
    module.load_random_state(state);
  };
  const auto region = [function](const std::vector<Tensor>& inputs) { return std::vector<Tensor>{function(inputs[0])}; };
  return autograd::recompute(region, {x}, module.parameters(), counters)[0];
}

WEFT_REGISTER_LAYER("transformer_block",
                    [](const LayerContext& context) { return std::make_shared<TransformerBlock>(context); });

}  // namespace weft
