// The weft <-> Hugging Face weight map (hugging_face_names.h). One table of pieces, built from the
// model's config, serves both directions, so reading and writing cannot disagree.
#include "launcher/hugging_face_names.h"

#include <algorithm>
#include <set>

#include "layers/mlp.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/concat.h"

namespace weft {
namespace {

// One weft parameter and the Hugging Face tensors it is made of.
struct Piece {
  std::string weft_name;
  Shape weft_shape;
  std::vector<std::string> names;  // Hugging Face names (with the model prefix); several: rows stacked
  std::vector<Shape> shapes;       // each as stored in a Hugging Face file
  bool transpose = false;          // GPT-2 Conv1D: stored [in, out]
  bool leading_rows = false;       // the file may hold more rows (the position table); weft takes the first
};

constexpr const char* kGpt2Prefix = "transformer.";
constexpr const char* kLlamaPrefix = "model.";
constexpr const char* kHead = "lm_head.weight";

std::vector<Piece> pieces_of(const ModelConfig& config, HuggingFaceFormat format) {
  const int64_t C = config.dim, V = config.vocab, T = config.seq_len, H = config.heads;
  const int64_t K = config.kv_heads > 0 ? config.kv_heads : config.heads;
  const int64_t D = C / H;
  const int64_t F = mlp_hidden_width(config);
  std::vector<Piece> pieces;
  auto add = [&](std::string weft_name, Shape weft_shape, std::string name, Shape shape, bool transpose = false) {
    pieces.push_back({std::move(weft_name), std::move(weft_shape), {std::move(name)}, {std::move(shape)}, transpose});
  };
  if (format == HuggingFaceFormat::kGpt2) {
    const std::string p = kGpt2Prefix;
    add("token_embedding.weight", {V, C}, p + "wte.weight", {V, C});
    add("position_embedding.weight", {T, C}, p + "wpe.weight", {T, C});
    pieces.back().leading_rows = true;
    for (int64_t layer = 0; layer < config.layers; ++layer) {
      const std::string w = str("blocks.", layer, ".");
      const std::string h = str(p, "h.", layer, ".");
      add(w + "norm1.weight", {C}, h + "ln_1.weight", {C});
      add(w + "norm1.bias", {C}, h + "ln_1.bias", {C});
      add(w + "attention.qkv.weight", {3 * C, C}, h + "attn.c_attn.weight", {C, 3 * C}, true);
      add(w + "attention.qkv.bias", {3 * C}, h + "attn.c_attn.bias", {3 * C});
      add(w + "attention.proj.weight", {C, C}, h + "attn.c_proj.weight", {C, C}, true);
      add(w + "attention.proj.bias", {C}, h + "attn.c_proj.bias", {C});
      add(w + "norm2.weight", {C}, h + "ln_2.weight", {C});
      add(w + "norm2.bias", {C}, h + "ln_2.bias", {C});
      add(w + "mlp.fc.weight", {F, C}, h + "mlp.c_fc.weight", {C, F}, true);
      add(w + "mlp.fc.bias", {F}, h + "mlp.c_fc.bias", {F});
      add(w + "mlp.proj.weight", {C, F}, h + "mlp.c_proj.weight", {F, C}, true);
      add(w + "mlp.proj.bias", {C}, h + "mlp.c_proj.bias", {C});
    }
    add("final_norm.weight", {C}, p + "ln_f.weight", {C});
    add("final_norm.bias", {C}, p + "ln_f.bias", {C});
  } else {
    const std::string p = kLlamaPrefix;
    add("token_embedding.weight", {V, C}, p + "embed_tokens.weight", {V, C});
    for (int64_t layer = 0; layer < config.layers; ++layer) {
      const std::string w = str("blocks.", layer, ".");
      const std::string h = str(p, "layers.", layer, ".");
      add(w + "norm1.weight", {C}, h + "input_layernorm.weight", {C});
      pieces.push_back({w + "attention.qkv.weight",
                        {(H + 2 * K) * D, C},
                        {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"},
                        {{H * D, C}, {K * D, C}, {K * D, C}}});
      add(w + "attention.proj.weight", {C, C}, h + "self_attn.o_proj.weight", {C, H * D});
      add(w + "norm2.weight", {C}, h + "post_attention_layernorm.weight", {C});
      add(w + "mlp.gate.weight", {F, C}, h + "mlp.gate_proj.weight", {F, C});
      add(w + "mlp.up.weight", {F, C}, h + "mlp.up_proj.weight", {F, C});
      add(w + "mlp.down.weight", {C, F}, h + "mlp.down_proj.weight", {C, F});
    }
    add("final_norm.weight", {C}, p + "norm.weight", {C});
  }
  if (!config.tie_embeddings) add("head.weight", {V, C}, kHead, {V, C});
  return pieces;
}

// Tensors of a Hugging Face file that are no weights of the model: buffers, and a tied head.
bool ignored(const std::string& name, const ModelConfig& config, HuggingFaceFormat format) {
  if (name == kHead) return config.tie_embeddings;
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (format == HuggingFaceFormat::kGpt2) return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  return ends_with(".self_attn.rotary_emb.inv_freq");
}

// The source's names as pieces_of spells them: files saved from the base model (GPT2Model,
// LlamaModel) lack the "transformer." / "model." prefix.
std::map<std::string, std::string> canonical_names(const HuggingFaceTensorSource& source, HuggingFaceFormat format) {
  const std::string prefix = format == HuggingFaceFormat::kGpt2 ? kGpt2Prefix : kLlamaPrefix;
  const bool prefixed = std::any_of(source.shapes.begin(), source.shapes.end(), [&](const auto& entry) {
    return entry.first.rfind(prefix, 0) == 0;
  });
  std::map<std::string, std::string> out;  // canonical -> as in the file
  for (const auto& [name, shape] : source.shapes) {
    out[prefixed || name == kHead ? name : prefix + name] = name;
  }
  return out;
}

}  // namespace

std::string hugging_face_format_name(HuggingFaceFormat format) {
  return format == HuggingFaceFormat::kGpt2 ? "hf-gpt2" : "hf-llama";
}

HuggingFaceFormat parse_hugging_face_format(const std::string& name) {
  if (name == "hf-gpt2") return HuggingFaceFormat::kGpt2;
  if (name == "hf-llama") return HuggingFaceFormat::kLlama;
  WEFT_FAIL("unknown format '", name, "'; the formats are hf-gpt2 and hf-llama");
}

void check_expressible(const ModelConfig& config, HuggingFaceFormat format) {
  const std::string name = hugging_face_format_name(format);
  WEFT_CHECK(config.type == "gpt" || config.type == "llama", "model.type = '", config.type,
             "' is not a built-in model; ", name, " maps the parameters of model.type gpt and llama only");
  const bool gpt2 = format == HuggingFaceFormat::kGpt2;
  // A Llama model type fixes these (layers/llama.h); the config holds them after load_config.
  const std::vector<std::tuple<std::string, std::string, std::string>> required =
      gpt2 ? std::vector<std::tuple<std::string, std::string, std::string>>{
                 {"model.positions", config.positions, "learned"},
                 {"model.norm", config.norm, "layer_norm"},
                 {"model.mlp", config.mlp, "gelu_mlp"},
                 {"model.bias", config.bias ? "true" : "false", "true"}}
           : std::vector<std::tuple<std::string, std::string, std::string>>{
                 {"model.positions", config.positions, "rope"},
                 {"model.norm", config.norm, "rms_norm"},
                 {"model.mlp", config.mlp, "swiglu_mlp"},
                 {"model.bias", config.bias ? "true" : "false", "false"}};
  for (const auto& [key, value, wanted] : required) {
    WEFT_CHECK(value == wanted, name, " cannot express ", key, " = ", value, ": ",
               gpt2 ? "GPT-2" : "Llama", " has ", wanted, gpt2 ? " (a rope model: use hf-llama)" : "");
  }
  if (gpt2) {
    WEFT_CHECK(config.kv_heads == 0 || config.kv_heads == config.heads, name, " cannot express model.kv_heads = ",
               config.kv_heads, " (grouped-query attention) with model.heads = ", config.heads,
               ": GPT-2 has one key/value head per query head");
  }
}

HuggingFaceFormat hugging_face_format_of(const ModelConfig& config) {
  const HuggingFaceFormat format = config.positions == "rope" ? HuggingFaceFormat::kLlama : HuggingFaceFormat::kGpt2;
  check_expressible(config, format);
  return format;
}

std::map<std::string, Tensor> weft_parameters_from_hugging_face(const HuggingFaceTensorSource& source,
                                                                const ModelConfig& config, HuggingFaceFormat format,
                                                                std::vector<std::string>* notes) {
  check_expressible(config, format);
  const std::vector<Piece> pieces = pieces_of(config, format);
  const std::map<std::string, std::string> names = canonical_names(source, format);
  std::vector<std::string> problems;
  std::set<std::string> used;
  for (const Piece& piece : pieces) {
    for (size_t i = 0; i < piece.names.size(); ++i) {
      const std::string& name = piece.names[i];
      const auto found = names.find(name);
      if (found == names.end()) {
        problems.push_back(str("missing tensor '", name, "' (expected shape ", shape_string(piece.shapes[i]),
                               ", for weft's ", piece.weft_name, ")"));
        continue;
      }
      used.insert(name);
      const Shape& shape = source.shapes.at(found->second);
      const Shape& expected = piece.shapes[i];
      const bool fits = piece.leading_rows ? shape.size() == 2 && shape[1] == expected[1] && shape[0] >= expected[0]
                                           : shape == expected;
      if (!fits) {
        problems.push_back(str("tensor '", found->second, "' has shape ", shape_string(shape), ", expected ",
                               shape_string(expected), piece.leading_rows ? " (or more rows)" : "",
                               " (for weft's ", piece.weft_name, ")"));
      }
    }
  }
  for (const auto& [name, original] : names) {
    if (used.count(name) == 0 && !ignored(name, config, format)) {
      problems.push_back(str("unexpected tensor '", original, "' (shape ", shape_string(source.shapes.at(original)),
                             "), which the model has no parameter for"));
    }
  }
  if (!problems.empty()) {
    std::string message = str("model.init_from: ", source.description, " does not fit the model (",
                              hugging_face_format_name(format), ", ", config.layers, " layers, dim ", config.dim,
                              ", heads ", config.heads, ", vocab ", config.vocab, "): ", problems.size(),
                              " problem(s):");
    const size_t shown = std::min<size_t>(problems.size(), 20);
    for (size_t i = 0; i < shown; ++i) message += "\n  " + problems[i];
    if (shown < problems.size()) message += str("\n  ... and ", problems.size() - shown, " more");
    message += "\nCheck that config.json (or the model keys) describe the model the weights were saved from";
    throw Error(message);
  }

  autograd::NoGradGuard no_grad;
  std::map<std::string, Tensor> parameters;
  for (const Piece& piece : pieces) {
    std::vector<Tensor> parts;
    for (const std::string& name : piece.names) parts.push_back(source.read(names.at(name)));
    Tensor tensor = parts.size() == 1 ? parts[0] : concat(parts, 0);
    if (piece.transpose) tensor = tensor.transpose(0, 1);
    if (piece.leading_rows && tensor.size(0) > piece.weft_shape[0]) {
      if (notes != nullptr) {
        notes->push_back(str(piece.names[0], " has ", tensor.size(0), " positions; the first model.seq_len = ",
                             piece.weft_shape[0], " are used"));
      }
      tensor = tensor.narrow(0, 0, piece.weft_shape[0]);
    }
    parameters[piece.weft_name] = tensor.contiguous();
  }
  return parameters;
}

std::map<std::string, Tensor> hugging_face_tensors_from_weft(const std::map<std::string, Tensor>& parameters,
                                                             const ModelConfig& config, HuggingFaceFormat format,
                                                             DType dtype) {
  check_expressible(config, format);
  autograd::NoGradGuard no_grad;
  std::map<std::string, Tensor> tensors;
  std::set<std::string> used;
  for (const Piece& piece : pieces_of(config, format)) {
    const auto found = parameters.find(piece.weft_name);
    WEFT_CHECK(found != parameters.end(), "the checkpoint has no parameter '", piece.weft_name, "', which ",
               hugging_face_format_name(format), " needs; it was not saved from this model");
    WEFT_CHECK(found->second.shape() == piece.weft_shape, "parameter '", piece.weft_name, "' has shape ",
               shape_string(found->second.shape()), ", but its config says ", shape_string(piece.weft_shape));
    used.insert(piece.weft_name);
    Tensor tensor = found->second.detach().to(Device::cpu());
    if (piece.transpose) tensor = tensor.transpose(0, 1);
    int64_t row = 0;
    for (size_t i = 0; i < piece.names.size(); ++i) {
      const int64_t rows = piece.names.size() == 1 ? tensor.size(0) : piece.shapes[i][0];
      tensors[piece.names[i]] = tensor.narrow(0, row, rows).contiguous().to(dtype);
      row += rows;
    }
  }
  for (const auto& [name, tensor] : parameters) {
    WEFT_CHECK(used.count(name) > 0, "parameter '", name, "' ", shape_string(tensor.shape()), " has no place in ",
               hugging_face_format_name(format), "; the model holds more than the format can express");
  }
  return tensors;
}

}  // namespace weft
