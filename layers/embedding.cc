// Embedding (embedding.h).
#include "layers/embedding.h"

#include "runtime/error.h"
#include "runtime/ops/embedding.h"

namespace weft {

Embedding::Embedding(int64_t vocab, int64_t dim, const LayerContext& context) : vocab_(vocab), dim_(dim) {
  WEFT_CHECK(vocab >= 1 && dim >= 1, "Embedding: sizes must be positive, got ", vocab, " x ", dim);
  register_parameter("weight", Tensor::normal({vocab, dim}, context.config.seed,
                                              context.next_offset(static_cast<uint64_t>(vocab * dim)), 0.0,
                                              context.config.init_std));
}

std::string Embedding::settings() const { return str(vocab_, " x ", dim_); }

Tensor Embedding::forward(const Tensor& ids) { return embedding(ids, weight()); }

}  // namespace weft
