// VocabParallelEmbedding (vocab_parallel_embedding.h).
#include "parallel/manual/vocab_parallel_embedding.h"

#include <utility>

#include "parallel/manual/mappings.h"
#include "parallel/tensor/sharding.h"
#include "parallel/tensor/vocab_parallel.h"
#include "runtime/error.h"
#include "runtime/ops/embedding.h"

namespace weft {

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab, int64_t dim, const LayerContext& context,
                                               TensorParallelGroup tp)
    : vocab_(vocab), dim_(dim), tp_(std::move(tp)) {
  const Tensor full = Tensor::normal({vocab, dim}, context.config.seed,
                                     context.next_offset(static_cast<uint64_t>(vocab * dim)), 0.0,
                                     context.config.init_std);  // [V, C], as Embedding draws it
  register_parameter("weight", shard_of(full, Layout::split(0), tp_.rank(), tp_.size()), Layout::split(0));
}

std::string VocabParallelEmbedding::settings() const { return str(vocab_, " / ", tp_.size(), " x ", dim_); }

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  if (tp_.size() == 1) return embedding(ids, weight());  // keeps embedding's check of the ids
  return reduce_from_tensor_parallel_region(vocab_parallel_embedding_partial(ids, weight(), vocab_start()), tp_);
}

}  // namespace weft
