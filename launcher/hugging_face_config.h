// Hugging Face config.json files: the model keys a GPT-2 or Llama config.json sets when a run
// starts from its weights (model.init_from), and the config.json weft-export writes.
//
// Precedence (model.init_from with a config.json beside the weights):
//   - config.json's values replace the defaults of the model keys it describes (model.type, dim,
//     layers, heads, kv_heads, vocab, seq_len, hidden_dim, norm_eps, rope_theta, norm, mlp,
//     positions, bias, tie_embeddings), and the config (--dump-config, checkpoints) says so;
//   - a model key the user set (a YAML file or --set) to a different value is an error naming both
//     values and where each came from: remove the key. The one exception is model.seq_len, which
//     may be set lower than n_positions / max_position_embeddings (GPT-2's learned position table
//     is then cut to its first model.seq_len rows, which the start-up log says);
//   - a setting weft cannot reproduce (another activation, rope_scaling, biases in a Llama,
//     GPT-2's scaled-by-layer attention, ...) is an error naming the field;
//   - fields that do not change the forward pass (token ids, dropouts, torch_dtype, ...) are ignored.
// Without a config.json the user's model keys must describe the weights; shapes are checked.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launcher/hugging_face_names.h"
#include "launcher/run_config.h"
#include "nlohmann/json.hpp"

namespace weft {

// One model key as config.json sets it.
struct HuggingFaceSetting {
  std::string key;    // "model.dim"
  std::string value;  // as --set would give it: "768"
  std::string field;  // "n_embd", for messages
};

// The config.json that belongs to `init_from` (a folder: FOLDER/config.json; a file: config.json
// beside it), or "" when there is none. Throws weft::Error when `init_from` itself does not exist.
std::string hugging_face_config_path(const std::string& init_from);

// The model keys `config_path` sets (model_type gpt2 or llama), or throws weft::Error naming the
// file and the field that weft cannot reproduce.
std::vector<HuggingFaceSetting> read_hugging_face_config(const std::string& config_path);

// Applies the config.json of config.model.init_from (if any) to `config` under the precedence
// above. `origin_of(key)` says where the user set a key ("" or "default": not set);
// `set_origin(key, origin)` records config.json as the origin of a key it sets.
void apply_hugging_face_config(RunConfig& config, const std::function<std::string(const std::string&)>& origin_of,
                               const std::function<void(const std::string&, const std::string&)>& set_origin);

// The config.json transformers' from_pretrained reads for `config` written as `format` with
// weights in `dtype` (architectures, model_type, torch_dtype and every size key). Throws
// weft::Error when the format cannot express the model.
nlohmann::ordered_json hugging_face_config_json(const ModelConfig& config, HuggingFaceFormat format, DType dtype);

}  // namespace weft
