// TransformerBlock: one pre-norm decoder block (GPT-2, Llama).
//
//   x [B, T, C] -> x + attention(norm1(x)) -> x + mlp(norm2(x)) -> [B, T, C]
//
// The norms and the MLP are created by name through LayerRegistry (config.norm, config.mlp), so a
// user's registered norm or MLP plugs in without touching this file; each must map [..., C] to
// [..., C] through Module::forward. Construction (and weight draw) order: norm1, attention, norm2,
// mlp. Registered as "transformer_block". With a LayerNorm as norm2, the first residual add and norm2
// run as one op (add_layer_norm, runtime/ops/normalization.h); the result is the same.
#pragma once

#include <memory>
#include <string>

#include "layers/attention.h"
#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const LayerContext& context);

  std::string type_name() const override { return "TransformerBlock"; }
  // x [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<Module> norm1_;                    // config.norm over C
  std::shared_ptr<CausalSelfAttention> attention_;
  std::shared_ptr<Module> norm2_;                    // config.norm over C
  std::shared_ptr<Module> mlp_;                      // config.mlp, C -> C
};

}  // namespace weft
