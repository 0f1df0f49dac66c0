// LlamaModel (llama.h).
#include "layers/llama.h"

namespace weft {

ModelConfig llama_config(const ModelConfig& config) {
  ModelConfig llama = config;
  llama.norm = "rms_norm";
  llama.mlp = "swiglu_mlp";
  llama.positions = "rope";
  llama.bias = false;
  llama.tie_embeddings = false;
  return llama;
}

// The temporary config lives until the base constructor returns, which is all it needs: layers copy
// the settings they keep.
LlamaModel::LlamaModel(const LayerContext& context)
    : GptModel(LayerContext{llama_config(context.config), context.offset}) {}

WEFT_REGISTER_LAYER("llama", [](const LayerContext& context) { return std::make_shared<LlamaModel>(context); });

}  // namespace weft
