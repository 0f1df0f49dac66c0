// ModelConfig: the `model` section of a run's YAML, as layers see it.
//
// The launcher fills it from YAML (launcher/config_options.cc declares each key with its type,
// default, help and validation); layers read it through their factories (layers/registry.h).
// `options` carries keys that built-in layers do not know, so a custom layer can take settings of
// its own from the same section.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace weft {

struct ModelConfig {
  std::string type = "gpt";          // registered model type: gpt, llama, or a custom one
  int64_t layers = 2;                // transformer blocks
  int64_t dim = 64;                  // model width C
  int64_t heads = 4;                 // attention heads H (C % H == 0)
  int64_t kv_heads = 0;              // key/value heads for grouped-query attention (0: = heads)
  int64_t vocab = 256;               // vocabulary size V
  int64_t seq_len = 64;              // maximum sequence length T
  int64_t hidden_dim = 0;            // MLP hidden width (0: 4C for gelu, 8C/3 rounded to 64 for swiglu)
  std::string mlp = "gelu_mlp";      // registered MLP layer type: gelu_mlp, swiglu_mlp, or custom
  std::string norm = "layer_norm";   // registered norm layer type: layer_norm, rms_norm, or custom
  std::string positions = "learned"; // learned | rope
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool bias = true;                  // biases in linear layers
  bool tie_embeddings = true;        // output projection shares the token embedding
  double dropout = 0.0;
  double init_std = 0.02;
  uint64_t seed = 1;                 // weights are drawn from Philox(seed)
  // Hugging Face weights to start from (launcher/pretrained_weights.h): a .safetensors file or a folder
  // holding one and config.json; empty: weights drawn from seed. Layers never read it.
  std::string init_from;
  // Activation recomputation, set from train.recompute by the launcher (not a model.* key: it trades
  // memory for time without changing the model): none | selective | full. The layers that own the
  // activations read it when built (layers/transformer_block.h says what each setting reruns).
  std::string recompute = "none";
  std::map<std::string, std::string> options;  // extra keys for custom layers
};

// Checks the settings the built-in layers rely on (sizes positive, model.heads divides model.dim,
// model.kv_heads divides model.heads, positions is learned or rope, an even head dim for rope, ...);
// throws weft::Error naming the key and its value. build_model (layers/language_model.h) calls it.
void validate_model_config(const ModelConfig& config);

}  // namespace weft
