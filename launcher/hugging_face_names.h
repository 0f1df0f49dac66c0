// The map between weft's parameters and Hugging Face's GPT-2 and Llama tensors: names, layouts and
// shapes, in both directions (model.init_from reads through it, weft-export writes through it).
//
// weft (layers/gpt.h)                          GPT-2 (GPT2LMHeadModel)             Llama (LlamaForCausalLM)
//   token_embedding.weight [V, C]              transformer.wte.weight [V, C]       model.embed_tokens.weight
//   position_embedding.weight [T, C]           transformer.wpe.weight [P, C], P>=T -
//   blocks.N.norm1.{weight,bias} [C]           transformer.h.N.ln_1.*              model.layers.N.input_layernorm.weight
//   blocks.N.attention.qkv.weight [(H+2K)D, C] attn.c_attn.weight [C, 3C] (^T)     self_attn.{q,k,v}_proj.weight, rows stacked
//   blocks.N.attention.qkv.bias [3C]           attn.c_attn.bias                    -
//   blocks.N.attention.proj.{weight,bias}      attn.c_proj.* [C, C] (^T)           self_attn.o_proj.weight
//   blocks.N.norm2.{weight,bias} [C]           ln_2.*                              post_attention_layernorm.weight
//   blocks.N.mlp.fc.{weight,bias} [F, C]       mlp.c_fc.* [C, F] (^T)              -
//   blocks.N.mlp.proj.{weight,bias} [C, F]     mlp.c_proj.* [F, C] (^T)            -
//   blocks.N.mlp.{gate,up,down}.weight         -                                   mlp.{gate,up,down}_proj.weight
//   final_norm.{weight,bias} [C]               transformer.ln_f.*                  model.norm.weight
//   head.weight [V, C] (untied only)           lm_head.weight                      lm_head.weight
//
// GPT-2's Conv1D stores weights [in, out], the transpose of weft's Linear [out, in]; c_attn's 3C
// output columns are q | k | v, which are weft's qkv rows [q; k; v]. Llama's q/k weights are taken
// as they are: Hugging Face's files already hold them in the rotate-half RoPE layout that weft uses
// (layers/rope.h), so the permutation Hugging Face's convert_llama_weights_to_hf.py applies to
// Meta's original weights is not applied again. Reading, a tied model ignores lm_head.weight (it
// may or may not be in the file); GPT-2's attn.bias / attn.masked_bias and Llama's
// rotary_emb.inv_freq are buffers, ignored; files saved from the base models (GPT2Model, LlamaModel:
// no "transformer." / "model." prefix) are read too. Everything else must match: a missing tensor,
// an unexpected one or a shape that differs is an error naming the tensor and both shapes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "layers/model_config.h"
#include "runtime/shape.h"
#include "runtime/tensor.h"

namespace weft {

enum class HuggingFaceFormat { kGpt2, kLlama };

// "hf-gpt2" / "hf-llama", as weft-export's --format spells them, and back (throws on others).
std::string hugging_face_format_name(HuggingFaceFormat format);
HuggingFaceFormat parse_hugging_face_format(const std::string& name);

// The format a weft model is, or throws weft::Error naming the setting that neither format can
// express (learned positions + layer_norm + gelu_mlp + biases: GPT-2; rope + rms_norm + swiglu_mlp
// without biases: Llama).
HuggingFaceFormat hugging_face_format_of(const ModelConfig& config);
// Throws weft::Error when `config` cannot be written as `format`, naming the setting.
void check_expressible(const ModelConfig& config, HuggingFaceFormat format);

// The tensors a safetensors set provides: name -> shape, and a way to read one as f32.
struct HuggingFaceTensorSource {
  std::map<std::string, Shape> shapes;
  std::function<Tensor(const std::string& name)> read;  // CPU f32
  std::string description;                              // the file(s), for messages
};

// weft's parameters (full, unsharded, f32) of the model `config` describes, from the Hugging Face
// tensors of `source` in `format`. Checks every name and shape first and throws weft::Error listing
// each problem (missing, unexpected, shape), nothing read. `notes` gets what was adapted, e.g. a
// position table truncated to model.seq_len.
std::map<std::string, Tensor> weft_parameters_from_hugging_face(const HuggingFaceTensorSource& source,
                                                                const ModelConfig& config, HuggingFaceFormat format,
                                                                std::vector<std::string>* notes = nullptr);

// The Hugging Face tensors of `format` for weft's `parameters` (full tensors, as in a checkpoint),
// in `dtype`. Throws weft::Error naming a parameter that is missing or has another shape.
std::map<std::string, Tensor> hugging_face_tensors_from_weft(const std::map<std::string, Tensor>& parameters,
                                                             const ModelConfig& config, HuggingFaceFormat format,
                                                             DType dtype = kFloat32);

}  // namespace weft
