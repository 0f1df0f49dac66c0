// LlamaModel: a Llama-style language model, registered as "llama".
//
// The GptModel skeleton with Llama's choices forced whatever the config says: norm = rms_norm,
// mlp = swiglu_mlp, positions = rope, no biases, untied output head. Everything else (sizes,
// kv_heads for grouped-query attention, rope_theta, norm_eps, hidden_dim, dropout, init) comes from
// the config. To mix Llama parts differently (say, a custom norm), use type "gpt" and set the keys.
#pragma once

#include <string>

#include "layers/gpt.h"

namespace weft {

// `config` with Llama's forced settings applied.
ModelConfig llama_config(const ModelConfig& config);

class LlamaModel : public GptModel {
 public:
  explicit LlamaModel(const LayerContext& context);
  std::string type_name() const override { return "Llama"; }
};

}  // namespace weft
