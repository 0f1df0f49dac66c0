// config.json reading, precedence and writing (hugging_face_config.h).
#include "launcher/hugging_face_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "launcher/config_options.h"
#include "layers/mlp.h"
#include "runtime/error.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

// config.json files nest a few levels (task_specific_params, rope_scaling, text_config).
constexpr int kMaximumDepth = 64;

// Typed access to config.json's fields, each error naming the file and the field.
class ConfigFields {
 public:
  ConfigFields(std::string path, nlohmann::json json) : path_(std::move(path)), json_(std::move(json)) {}

  bool has(const std::string& field) const { return json_.contains(field) && !json_.at(field).is_null(); }
  int64_t integer(const std::string& field, int64_t fallback) const {
    if (!has(field)) return fallback;
    const nlohmann::json& value = json_.at(field);
    WEFT_CHECK(value.is_number_integer() && value.get<int64_t>() > 0, path_, ": field '", field,
               "' must be a positive integer, got ", value.dump());
    return value.get<int64_t>();
  }
  double number(const std::string& field, double fallback) const {
    if (!has(field)) return fallback;
    const nlohmann::json& value = json_.at(field);
    WEFT_CHECK(value.is_number() && value.get<double>() > 0, path_, ": field '", field,
               "' must be a positive number, got ", value.dump());
    return value.get<double>();
  }
  bool boolean(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    WEFT_CHECK(json_.at(field).is_boolean(), path_, ": field '", field, "' must be true or false, got ",
               json_.at(field).dump());
    return json_.at(field).get<bool>();
  }
  std::string text(const std::string& field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    WEFT_CHECK(json_.at(field).is_string(), path_, ": field '", field, "' must be text, got ", json_.at(field).dump());
    return json_.at(field).get<std::string>();
  }
  // A field whose value weft cannot reproduce: an error naming it, its value and what weft supports.
  [[noreturn]] void unsupported(const std::string& field, const std::string& supported) const {
    WEFT_FAIL(path_, ": field '", field, "' = ", json_.at(field).dump(), " is not supported by weft (", supported,
              "); weft cannot start from these weights");
  }
  const nlohmann::json& at(const std::string& field) const { return json_.at(field); }

 private:
  std::string path_;
  nlohmann::json json_;
};

std::string format_number(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

std::vector<HuggingFaceSetting> gpt2_settings(const ConfigFields& fields) {
  const std::string activation = fields.text("activation_function", "gelu_new");
  // weft's GELU is the tanh approximation (runtime/ops/elementwise.h): gelu_new, also named gelu_pytorch_tanh.
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    fields.unsupported("activation_function", "weft's GELU is the tanh approximation: gelu_new or gelu_pytorch_tanh");
  }
  if (!fields.boolean("scale_attn_weights", true)) fields.unsupported("scale_attn_weights", "true only");
  if (fields.boolean("scale_attn_by_inverse_layer_idx", false)) {
    fields.unsupported("scale_attn_by_inverse_layer_idx", "false only");
  }
  if (fields.boolean("add_cross_attention", false)) fields.unsupported("add_cross_attention", "false only");
  const int64_t dim = fields.integer("n_embd", 768);
  int64_t hidden = 0;
  if (fields.has("n_inner")) {
    hidden = fields.integer("n_inner", 0);
  } else if (__builtin_mul_overflow(dim, 4, &hidden)) {
    fields.unsupported("n_embd", "n_inner, which defaults to 4 x n_embd, must fit in 64 bits");
  }
  return {{"model.type", "gpt", "model_type"},
          {"model.dim", std::to_string(dim), "n_embd"},
          {"model.layers", std::to_string(fields.integer("n_layer", 12)), "n_layer"},
          {"model.heads", std::to_string(fields.integer("n_head", 12)), "n_head"},
          {"model.kv_heads", "0", "n_head"},
          {"model.vocab", std::to_string(fields.integer("vocab_size", 50257)), "vocab_size"},
          {"model.seq_len", std::to_string(fields.integer("n_positions", 1024)), "n_positions"},
          {"model.hidden_dim", std::to_string(hidden), "n_inner"},
          {"model.norm_eps", format_number(fields.number("layer_norm_epsilon", 1e-5)), "layer_norm_epsilon"},
          {"model.norm", "layer_norm", "model_type"},
          {"model.mlp", "gelu_mlp", "activation_function"},
          {"model.positions", "learned", "model_type"},
          {"model.bias", "true", "model_type"},
          {"model.tie_embeddings", fields.boolean("tie_word_embeddings", true) ? "true" : "false",
           "tie_word_embeddings"}};
}

std::vector<HuggingFaceSetting> llama_settings(const ConfigFields& fields) {
  if (fields.text("hidden_act", "silu") != "silu") fields.unsupported("hidden_act", "silu only (SwiGLU)");
  if (fields.has("rope_scaling")) fields.unsupported("rope_scaling", "plain RoPE only: null");
  if (fields.boolean("attention_bias", false)) fields.unsupported("attention_bias", "false only");
  if (fields.boolean("mlp_bias", false)) fields.unsupported("mlp_bias", "false only");
  const int64_t dim = fields.integer("hidden_size", 4096);
  const int64_t heads = fields.integer("num_attention_heads", 32);
  // head_dim x heads == hidden_size, written without the product, which a damaged file could overflow.
  if (fields.has("head_dim") && (dim % heads != 0 || fields.integer("head_dim", 0) != dim / heads)) {
    fields.unsupported("head_dim", str("hidden_size / num_attention_heads = ", dim / heads, " only"));
  }
  const int64_t kv_heads = fields.integer("num_key_value_heads", heads);
  const bool tied = fields.boolean("tie_word_embeddings", false);
  // weft's llama type is untied (layers/llama.h); a tied Llama is the gpt type with Llama's layers.
  return {{"model.type", tied ? "gpt" : "llama", tied ? "tie_word_embeddings" : "model_type"},
          {"model.dim", std::to_string(dim), "hidden_size"},
          {"model.layers", std::to_string(fields.integer("num_hidden_layers", 32)), "num_hidden_layers"},
          {"model.heads", std::to_string(heads), "num_attention_heads"},
          {"model.kv_heads", kv_heads == heads ? "0" : std::to_string(kv_heads), "num_key_value_heads"},
          {"model.vocab", std::to_string(fields.integer("vocab_size", 32000)), "vocab_size"},
          {"model.seq_len", std::to_string(fields.integer("max_position_embeddings", 2048)), "max_position_embeddings"},
          {"model.hidden_dim", std::to_string(fields.integer("intermediate_size", 11008)), "intermediate_size"},
          {"model.norm_eps", format_number(fields.number("rms_norm_eps", 1e-6)), "rms_norm_eps"},
          {"model.rope_theta", format_number(fields.number("rope_theta", 10000.0)), "rope_theta"},
          {"model.norm", "rms_norm", "model_type"},
          {"model.mlp", "swiglu_mlp", "hidden_act"},
          {"model.positions", "rope", "model_type"},
          {"model.bias", "false", "attention_bias"},
          {"model.tie_embeddings", tied ? "true" : "false", "tie_word_embeddings"}};
}

}  // namespace

std::string hugging_face_config_path(const std::string& init_from) {
  std::error_code error;
  const fs::path path(init_from);
  WEFT_CHECK(fs::exists(path, error), "model.init_from: '", init_from, "' does not exist; give a model.safetensors "
             "file or a folder holding model.safetensors (and config.json), as Hugging Face publishes them");
  const fs::path config = fs::is_directory(path, error) ? path / "config.json"
                                                        : (path.has_parent_path() ? path.parent_path() : ".") / "config.json";
  return fs::is_regular_file(config, error) ? config.string() : "";
}

std::vector<HuggingFaceSetting> read_hugging_face_config(const std::string& config_path) {
  std::ifstream file(config_path);
  WEFT_CHECK(file, "cannot read '", config_path, "'");
  nlohmann::json json;
  try {
    // Printing a value (the error messages do) recurses once per level of nesting, so a damaged file
    // of a million '[' would overflow the stack: deeper than any config.json nests is an error here.
    json = nlohmann::json::parse(file, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      WEFT_CHECK(depth <= kMaximumDepth, config_path, " nests deeper than ", kMaximumDepth,
                 " levels, which no config.json does: the file is damaged");
      return true;
    });
  } catch (const nlohmann::json::exception& error) {
    WEFT_FAIL(config_path, " is not valid JSON: ", error.what());
  }
  WEFT_CHECK(json.is_object(), config_path, " must hold a JSON object");
  const ConfigFields fields(config_path, json);
  WEFT_CHECK(fields.has("model_type"), config_path, " has no 'model_type'; weft reads gpt2 and llama configs");
  const std::string type = fields.text("model_type", "");
  if (type == "gpt2") return gpt2_settings(fields);
  if (type == "llama") return llama_settings(fields);
  fields.unsupported("model_type", "gpt2 or llama");
}

void apply_hugging_face_config(RunConfig& config, const std::function<std::string(const std::string&)>& origin_of,
                               const std::function<void(const std::string&, const std::string&)>& set_origin) {
  if (config.model.init_from.empty()) return;
  const std::string path = hugging_face_config_path(config.model.init_from);
  if (path.empty()) return;
  for (const HuggingFaceSetting& setting : read_hugging_face_config(path)) {
    const ConfigOption* option = find_config_option(setting.key);
    WEFT_CHECK(option != nullptr, "internal: config.json maps to unknown key ", setting.key);
    RunConfig scratch = config;
    const std::string problem = option->assign(scratch, setting.value);
    WEFT_CHECK(problem.empty(), path, ": field '", setting.field, "' gives ", setting.key, " = ", setting.value,
               ", which weft refuses: ", problem);
    const std::string wanted = option->format(scratch);
    const std::string current = option->format(config);
    const std::string origin = origin_of(setting.key);
    const bool set_by_user = !origin.empty() && origin != "default";
    if (set_by_user && current != wanted) {
      // A shorter context than the checkpoint's is fine: the learned table is cut, rope needs none.
      if (setting.key == "model.seq_len" && config.model.seq_len < scratch.model.seq_len) continue;
      WEFT_FAIL(setting.key, " = ", current, " (", origin, ") differs from ", setting.key, " = ", wanted,
                " that model.init_from's ", path, " gives (field '", setting.field,
                "'): the weights have that shape; remove ", setting.key, " from your config",
                setting.key == "model.seq_len" ? " (or set it lower than the config.json value)" : "");
    }
    option->assign(config, setting.value);
    set_origin(setting.key, str(path, " field '", setting.field, "'"));
  }
}

nlohmann::ordered_json hugging_face_config_json(const ModelConfig& config, HuggingFaceFormat format, DType dtype) {
  check_expressible(config, format);
  const std::string torch_dtype = dtype == kBFloat16 ? "bfloat16" : dtype == kFloat16 ? "float16" : "float32";
  WEFT_CHECK(dtype == kFloat32 || dtype == kBFloat16 || dtype == kFloat16, "weft-export writes f32, bf16 or f16, not ",
             dtype_name(dtype));
  const int64_t hidden = mlp_hidden_width(config);
  nlohmann::ordered_json json;
  if (format == HuggingFaceFormat::kGpt2) {
    json["architectures"] = {"GPT2LMHeadModel"};
    json["model_type"] = "gpt2";
    json["vocab_size"] = config.vocab;
    json["n_positions"] = config.seq_len;
    json["n_ctx"] = config.seq_len;
    json["n_embd"] = config.dim;
    json["n_layer"] = config.layers;
    json["n_head"] = config.heads;
    json["n_inner"] = hidden;
    json["activation_function"] = "gelu_new";
    json["layer_norm_epsilon"] = config.norm_eps;
    json["resid_pdrop"] = config.dropout;
    json["embd_pdrop"] = config.dropout;
    json["attn_pdrop"] = 0.0;  // weft drops out after the attention projection, not the attention weights
    json["initializer_range"] = config.init_std;
    json["scale_attn_weights"] = true;
    json["tie_word_embeddings"] = config.tie_embeddings;
  } else {
    json["architectures"] = {"LlamaForCausalLM"};
    json["model_type"] = "llama";
    json["vocab_size"] = config.vocab;
    json["hidden_size"] = config.dim;
    json["intermediate_size"] = hidden;
    json["num_hidden_layers"] = config.layers;
    json["num_attention_heads"] = config.heads;
    json["num_key_value_heads"] = config.kv_heads > 0 ? config.kv_heads : config.heads;
    json["head_dim"] = config.dim / config.heads;
    json["hidden_act"] = "silu";
    json["max_position_embeddings"] = config.seq_len;
    json["rms_norm_eps"] = config.norm_eps;
    json["rope_theta"] = config.rope_theta;
    json["rope_scaling"] = nullptr;
    json["attention_bias"] = false;
    json["mlp_bias"] = false;
    json["attention_dropout"] = 0.0;
    json["initializer_range"] = config.init_std;
    json["tie_word_embeddings"] = config.tie_embeddings;
  }
  json["torch_dtype"] = torch_dtype;
  return json;
}

}  // namespace weft
