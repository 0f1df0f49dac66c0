// validate_model_config (model_config.h): one check per key, each message naming the key as it is
// spelt in YAML ("model.heads") so a user knows which line to fix.
#include "layers/model_config.h"

#include "runtime/error.h"

namespace weft {

void validate_model_config(const ModelConfig& config) {
  WEFT_CHECK(!config.type.empty(), "model.type must name a registered model (gpt, llama, or a custom one)");
  WEFT_CHECK(config.layers >= 1, "model.layers = ", config.layers, " must be at least 1");
  WEFT_CHECK(config.dim >= 1, "model.dim = ", config.dim, " must be at least 1");
  WEFT_CHECK(config.heads >= 1, "model.heads = ", config.heads, " must be at least 1");
  WEFT_CHECK(config.dim % config.heads == 0, "model.heads = ", config.heads, " does not divide model.dim = ",
             config.dim);
  WEFT_CHECK(config.kv_heads >= 0, "model.kv_heads = ", config.kv_heads, " must be 0 (same as model.heads) or positive");
  const int64_t kv_heads = config.kv_heads > 0 ? config.kv_heads : config.heads;
  WEFT_CHECK(config.heads % kv_heads == 0, "model.kv_heads = ", config.kv_heads, " does not divide model.heads = ",
             config.heads);
  WEFT_CHECK(config.vocab >= 1, "model.vocab = ", config.vocab, " must be at least 1");
  WEFT_CHECK(config.seq_len >= 1, "model.seq_len = ", config.seq_len, " must be at least 1");
  WEFT_CHECK(config.hidden_dim >= 0, "model.hidden_dim = ", config.hidden_dim,
             " must be 0 (the MLP's default width) or positive");
  WEFT_CHECK(config.positions == "learned" || config.positions == "rope", "model.positions = '", config.positions,
             "' is not one of: learned, rope");
  WEFT_CHECK(config.positions != "rope" || (config.dim / config.heads) % 2 == 0,
             "model.positions = rope needs an even head dim, but model.dim / model.heads = ", config.dim, " / ",
             config.heads, " = ", config.dim / config.heads);
  WEFT_CHECK(config.rope_theta > 0, "model.rope_theta = ", config.rope_theta, " must be positive");
  WEFT_CHECK(config.norm_eps > 0, "model.norm_eps = ", config.norm_eps, " must be positive");
  WEFT_CHECK(config.dropout >= 0 && config.dropout < 1, "model.dropout = ", config.dropout, " must be in [0, 1)");
  WEFT_CHECK(config.init_std >= 0, "model.init_std = ", config.init_std, " must not be negative");
  WEFT_CHECK(!config.mlp.empty(), "model.mlp must name a registered MLP layer (gelu_mlp, swiglu_mlp, or custom)");
  WEFT_CHECK(!config.norm.empty(), "model.norm must name a registered norm layer (layer_norm, rms_norm, or custom)");
  WEFT_CHECK(config.recompute == "none" || config.recompute == "selective" || config.recompute == "full",
             "train.recompute = '", config.recompute, "' is not one of: none, selective, full");
}

}  // namespace weft
