// GptModel (gpt.h).
#include "layers/gpt.h"

#include "layers/transformer_block.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"

namespace weft {

GptModel::GptModel(const LayerContext& context)
    : config_(context.config), dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  token_embedding_ = register_module("token_embedding", std::make_shared<Embedding>(config.vocab, config.dim, context));
  if (config.positions == "learned") {
    position_embedding_ =
        register_module("position_embedding", std::make_shared<Embedding>(config.seq_len, config.dim, context));
  }
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t layer = 0; layer < config.layers; ++layer) blocks_->append(std::make_shared<TransformerBlock>(context));
  final_norm_ = register_module("final_norm", LayerRegistry::global().create(config.norm, context));
  if (config.tie_embeddings) {
    head_ = register_module("head", std::make_shared<TiedLinear>(*token_embedding_));
  } else {
    head_ = register_module("head", std::make_shared<Linear>(config.dim, config.vocab, /*bias=*/false, context));
  }
}

std::string GptModel::settings() const {
  std::string out = str("vocab ", config_.vocab, ", dim ", config_.dim, ", layers ", config_.layers, ", heads ",
                        config_.heads);
  if (config_.kv_heads > 0 && config_.kv_heads != config_.heads) out += str(", kv_heads ", config_.kv_heads);
  out += str(", seq_len ", config_.seq_len, ", ", config_.positions, " positions, ", config_.norm, ", ", config_.mlp);
  out += config_.tie_embeddings ? ", tied" : ", untied";
  return out;
}

Tensor GptModel::embed(const Tensor& ids) {
  WEFT_CHECK(ids.dim() == 2, type_name(), ".logits: ids must be [B, T], got ", ids.describe());
  const int64_t time = ids.size(1);
  WEFT_CHECK(time >= 1 && time <= config_.seq_len, type_name(), ".logits: a sequence of ", time,
             " tokens does not fit model.seq_len = ", config_.seq_len);
  Tensor x = token_embedding_->call(ids);  // [B, T, C]
  if (position_embedding_ != nullptr) {
    // Rows 0..T-1 of the table, a view: the same as looking up arange(T), without the lookup.
    x = add(x, position_embedding_->weight().narrow(0, 0, time));  // + [T, C]
  }
  return dropout_.apply(x, is_training());
}

Tensor GptModel::head(const Tensor& x) {
  return head_->call(final_norm_->call(x));  // [B, T, V]
}

Tensor GptModel::run_segment(size_t index, const Tensor& input) {
  if (index == 0) return embed(input);
  if (index <= blocks_->size()) return (*blocks_)[index - 1].call(input);
  return head(input);
}

// The composition of the segments, without building their list (names, parameter lists) per call.
Tensor GptModel::logits(const Tensor& ids) {
  Tensor x = ids;
  for (size_t index = 0; index < blocks_->size() + 2; ++index) x = run_segment(index, x);
  return x;
}

std::vector<ModelSegment> GptModel::segments() {
  return decoder_segments(named_parameters(), blocks_->size(), config_.tie_embeddings,
                          [this](size_t index, const Tensor& x) { return run_segment(index, x); });
}

std::vector<ParallelPlanEntry> GptModel::tensor_parallel_plan() const {
  return {{"token_embedding", ParallelStyle::kVocabulary, {}}, {"head", ParallelStyle::kColumn, {}}};
}

WEFT_REGISTER_LAYER("gpt", [](const LayerContext& context) { return std::make_shared<GptModel>(context); });

}  // namespace weft
