// TensorParallelGpt: layers/gpt.h's GPT/Llama skeleton built from the manual comm mode's parallel
// layers (Megatron-LM's GPTModel), and build_tensor_parallel_model, its factory.
//
//   ids [B, T] -> token_embedding: VocabParallelEmbedding [V/N, C] (all-reduced)
//   (+ position_embedding [seq_len, C], replicated) -> (sequence parallel: scatter to [B, T/N, C])
//   -> dropout -> blocks (layers x ParallelTransformerBlock) -> final_norm
//   -> (sequence parallel: gather to [B, T, C]) -> head [V/N, C] (or the tied token-embedding shard)
//   -> logits [B, T, V/N]: this rank's vocabulary columns, Split(-1), never gathered; the loss is
//      vocab_parallel_cross_entropy (parallel/tensor/vocab_parallel.h)
//
// Parameter names and segments() ("embedding", "block N", "head") are GptModel's. Every weight is
// drawn whole in GptModel's order (same Philox offsets and dropout stream ids) and this rank keeps
// shard_of(full, layout, rank, N), so a tp model starts from exactly the one-process model. Under
// sequence parallelism the norm parameters and the row-parallel biases (attention.proj.bias,
// mlp.proj.bias / mlp.down.bias) have partial gradients (NamedParameter::partial_gradient: the
// strategy sums them over tp), and every dropout stream draws its chunk of the one-process masks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/dropout_stream.h"
#include "layers/embedding.h"
#include "layers/language_model.h"
#include "layers/module_list.h"
#include "parallel/manual/column_parallel_linear.h"
#include "parallel/manual/vocab_parallel_embedding.h"

namespace weft {

class TensorParallelGpt : public LanguageModel {
 public:
  // context.config: a validated gpt config, or llama_config of a llama one.
  TensorParallelGpt(const LayerContext& context, const std::string& type, TensorParallelGroup tp,
                    bool sequence_parallel);

  std::string type_name() const override { return type_name_; }
  std::string settings() const override;
  // ids [B, T] -> [B, T, V/N], this rank's vocabulary shard
  Tensor logits(const Tensor& ids) override;
  std::vector<ModelSegment> segments() override;

 private:
  ModelConfig config_;
  std::string type_name_;                                  // "TensorParallelGPT", "TensorParallelLlama"
  TensorParallelGroup tp_;
  bool sequence_parallel_;
  std::shared_ptr<VocabParallelEmbedding> token_embedding_;  // [V/N, C]
  std::shared_ptr<Embedding> position_embedding_;            // [seq_len, C]; null with rope
  std::shared_ptr<ModuleList> blocks_;                       // layers x ParallelTransformerBlock
  std::shared_ptr<Module> final_norm_;                       // config.norm over C
  std::shared_ptr<ColumnParallelLinear> head_;               // [V/N, C]; null when tied
  DropoutStream dropout_;                                    // on the embeddings

  // ids [B, T] -> [B, T, C] (sequence parallel: [B, T/N, C])
  Tensor embed(const Tensor& ids);
  // [B, T, C] (sequence parallel: [B, T/N, C]) -> [B, T, V/N]
  Tensor head(const Tensor& x);
  // Segment `index`: 0 embed, 1..layers block index - 1, layers + 1 head.
  Tensor run_segment(size_t index, const Tensor& input);
};

// Validates `config` (validate_model_config, and that tp divides model.heads, model.kv_heads,
// model.vocab and the MLP hidden width, and model.seq_len under sequence parallelism; each error
// names the key and the tp sizes that fit) and builds model.type gpt or llama for this rank of tp.
std::shared_ptr<LanguageModel> build_tensor_parallel_model(const ModelConfig& config, const TensorParallelGroup& tp,
                                                           bool sequence_parallel);

}  // namespace weft
