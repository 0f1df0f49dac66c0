// TensorParallelGpt and build_tensor_parallel_model (tensor_parallel_gpt.h).
#include "parallel/manual/tensor_parallel_gpt.h"

#include <numeric>
#include <utility>

#include "layers/llama.h"
#include "layers/mlp.h"
#include "parallel/manual/mappings.h"
#include "parallel/manual/parallel_mlp.h"
#include "parallel/manual/parallel_transformer_block.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"

namespace weft {

TensorParallelGpt::TensorParallelGpt(const LayerContext& context, const std::string& type, TensorParallelGroup tp,
                                     bool sequence_parallel)
    : config_(context.config),
      type_name_(type == "llama" ? "TensorParallelLlama" : "TensorParallelGPT"),
      tp_(std::move(tp)),
      sequence_parallel_(sequence_parallel),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {  // as GptModel
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  token_embedding_ = register_module("token_embedding",
                                     std::make_shared<VocabParallelEmbedding>(config.vocab, config.dim, context, tp_));
  if (config.positions == "learned") {
    position_embedding_ =
        register_module("position_embedding", std::make_shared<Embedding>(config.seq_len, config.dim, context));
  }
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    blocks_->append(std::make_shared<ParallelTransformerBlock>(context, tp_, sequence_parallel));
  }
  final_norm_ = register_module("final_norm", LayerRegistry::global().create(config.norm, context));
  if (!config.tie_embeddings) {
    head_ = register_module("head", std::make_shared<ColumnParallelLinear>(config.dim, config.vocab, false, context,
                                                                           config.init_std, tp_, sequence_parallel));
  }
  if (sequence_parallel) {
    mark_partial_gradients(*final_norm_);
    set_random_sequence_shard(tp_.rank(), tp_.size());  // dropout masks: this rank's chunk of one process's
  }
}

std::string TensorParallelGpt::settings() const {
  return str("vocab ", config_.vocab, ", dim ", config_.dim, ", layers ", config_.layers, ", heads ", config_.heads,
             ", seq_len ", config_.seq_len, ", ", config_.positions, " positions, ", config_.norm, ", ", config_.mlp,
             config_.tie_embeddings ? ", tied" : ", untied", ", tp ", tp_.size(),
             sequence_parallel_ ? ", sequence parallel" : "");
}

Tensor TensorParallelGpt::embed(const Tensor& ids) {
  WEFT_CHECK(ids.dim() == 2, type_name(), ".logits: ids must be [B, T], got ", ids.describe());
  const int64_t time = ids.size(1);
  WEFT_CHECK(time >= 1 && time <= config_.seq_len, type_name(), ".logits: a sequence of ", time,
             " tokens does not fit model.seq_len = ", config_.seq_len);
  Tensor x = token_embedding_->call(ids);  // [B, T, C], summed over the vocabulary shards
  if (position_embedding_ != nullptr) x = add(x, position_embedding_->weight().narrow(0, 0, time));  // + [T, C]
  if (sequence_parallel_) x = scatter_to_sequence_parallel_region(x, tp_);  // [B, T/N, C]
  return dropout_.apply(x, is_training());
}

Tensor TensorParallelGpt::head(const Tensor& x) {
  const Tensor normed = final_norm_->call(x);
  const Tensor input = sequence_parallel_ ? gather_from_sequence_parallel_region(normed, tp_)
                                          : copy_to_tensor_parallel_region(normed, tp_);  // [B, T, C]
  const Tensor output_weight = head_ != nullptr ? head_->weight() : token_embedding_->weight();  // [V/N, C]
  return linear(input, output_weight);  // [B, T, V/N]
}

Tensor TensorParallelGpt::run_segment(size_t index, const Tensor& input) {
  if (index == 0) return embed(input);
  if (index <= blocks_->size()) return (*blocks_)[index - 1].call(input);
  return head(input);
}

Tensor TensorParallelGpt::logits(const Tensor& ids) {
  Tensor x = ids;
  for (size_t index = 0; index < blocks_->size() + 2; ++index) x = run_segment(index, x);
  return x;
}

std::vector<ModelSegment> TensorParallelGpt::segments() {
  return decoder_segments(named_parameters(), blocks_->size(), head_ == nullptr,
                          [this](size_t index, const Tensor& x) { return run_segment(index, x); });
}

namespace {

struct SplitSize {
  std::string key;   // what the message names: "model.heads"
  int64_t size;
  std::string note;  // why it must divide, where that is not obvious
};

// Throws unless tp divides each size; the message names the first that it does not divide and the tp
// sizes that divide them all.
void check_tp_divides(int64_t tp, const std::vector<SplitSize>& sizes) {
  int64_t common = 0;
  for (const SplitSize& entry : sizes) common = std::gcd(common, entry.size);
  std::string fitting;
  for (int64_t candidate = 1; candidate <= common; ++candidate) {
    if (common % candidate == 0) fitting += str(fitting.empty() ? "" : candidate == common ? " or " : ", ", candidate);
  }
  for (const SplitSize& entry : sizes) {
    WEFT_CHECK(entry.size % tp == 0, "parallel.tp = ", tp, " does not divide ", entry.key, " = ", entry.size,
               entry.note, "; use tp ", fitting);
  }
}

}  // namespace

std::shared_ptr<LanguageModel> build_tensor_parallel_model(const ModelConfig& config, const TensorParallelGroup& tp,
                                                           bool sequence_parallel) {
  WEFT_CHECK(config.type == "gpt" || config.type == "llama", "model.type = '", config.type,
             "' has no tensor-parallel version in comm.mode: manual, which builds gpt and llama only; use "
             "comm.mode: auto for another model type");
  const ModelConfig model = config.type == "llama" ? llama_config(config) : config;
  validate_model_config(model);
  check_parallel_mlp(model);
  std::vector<SplitSize> sizes = {{"model.heads", model.heads, ""}};
  if (model.kv_heads > 0) sizes.push_back({"model.kv_heads", model.kv_heads, ""});
  sizes.push_back({"model.vocab", model.vocab, ""});
  if (model.hidden_dim > 0) {
    sizes.push_back({"model.hidden_dim", model.hidden_dim, ""});
  } else {
    sizes.push_back({str("the ", model.mlp, " hidden width"), mlp_hidden_width(model),
                     " (its default, model.hidden_dim = 0)"});
  }
  if (sequence_parallel) sizes.push_back({"model.seq_len", model.seq_len, " (sequence parallelism splits it)"});
  check_tp_divides(tp.size(), sizes);
  uint64_t offset = 0;  // as build_model: every build draws from counter 0
  return std::make_shared<TensorParallelGpt>(LayerContext{model, &offset}, config.type, tp, sequence_parallel);
}

}  // namespace weft
