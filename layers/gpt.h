// GptModel: a GPT-2 style decoder-only language model, registered as "gpt".
//
//   ids [B, T] -> token_embedding [V, C] (+ position_embedding [T_max, C] rows 0..T-1 when
//   positions == learned) -> dropout -> blocks (layers x TransformerBlock) -> final_norm
//   -> logits [B, T, V] = x token_embedding^T when tie_embeddings, else x head^T (head [V, C], no bias)
//
// Norms and MLPs come from config.norm / config.mlp through the registry, so the same skeleton
// builds a Llama (layers/llama.h) or a model with a user's own layers. Parameter names:
// token_embedding.weight, position_embedding.weight, blocks.N.{norm1,attention,norm2,mlp}...,
// final_norm.weight, head.weight. Draw order is construction order: token embedding, position
// embedding, blocks in order, final norm, head.
//
// Segments (layers/model_segment.h): "embedding" (ids -> embeddings + dropout), one per block
// ("block N"), and "head" (final norm and output projection); logits() runs them in order. With
// tied embeddings the head reads token_embedding.weight too (a TiedLinear named "head", with no
// parameter of its own).
//
// Tensor parallelism (auto mode, tensor_parallel_plan): the token embedding split by vocabulary,
// the head column-wise (the logits stay split by vocabulary: vocabulary-parallel cross-entropy);
// under sequence parallelism the blocks run on sequence chunks from the first block's input to the
// head's (ModelSegment's flags), the embedding and its dropout on the whole sequence.
#pragma once

#include <memory>
#include <string>

#include "layers/dropout_stream.h"
#include "layers/embedding.h"
#include "layers/language_model.h"
#include "layers/linear.h"
#include "layers/module_list.h"
#include "layers/registry.h"

namespace weft {

class GptModel : public LanguageModel {
 public:
  explicit GptModel(const LayerContext& context);

  std::string type_name() const override { return "GPT"; }
  std::string settings() const override;
  // ids [B, T] -> [B, T, V]
  Tensor logits(const Tensor& ids) override;
  std::vector<ModelSegment> segments() override;
  std::vector<ParallelPlanEntry> tensor_parallel_plan() const override;

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;                              // as built (a Llama's forced settings included)
  std::shared_ptr<Embedding> token_embedding_;      // [V, C]
  std::shared_ptr<Embedding> position_embedding_;   // [seq_len, C]; null with rope
  std::shared_ptr<ModuleList> blocks_;              // layers x TransformerBlock
  std::shared_ptr<Module> final_norm_;              // config.norm over C
  std::shared_ptr<LinearLayer> head_;               // Linear [V, C], or TiedLinear
  DropoutStream dropout_;                           // on the embeddings

  // ids [B, T] -> [B, T, C]: token (+ position) embeddings, dropout.
  Tensor embed(const Tensor& ids);
  // [B, T, C] -> [B, T, V]: final norm, output projection.
  Tensor head(const Tensor& x);
  // Segment `index` (0: embed, 1..layers: block index - 1, layers + 1: head) on its input; what
  // both segments() and logits() run.
  Tensor run_segment(size_t index, const Tensor& input);
};

}  // namespace weft
