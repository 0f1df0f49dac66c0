// VocabParallelEmbedding: the token embedding with its vocabulary rows split over the tp group
// (Megatron's VocabParallelEmbedding), for the manual comm mode.
//
//   weight [V/N, C]  Split(0): rank r holds ids [r V/N, (r + 1) V/N)
//   ids [...] -> vocab_parallel_embedding_partial (parallel/tensor/vocab_parallel.h), a partial sum
//   -> reduce_from_tensor_parallel_region -> [..., C] replicated
//
// The weight is drawn whole as layers/embedding.h's Embedding draws it and sharded (shard_of); a
// tied output head multiplies by this same shard, which gives the vocabulary-parallel logits.
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"
#include "layers/registry.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

class VocabParallelEmbedding : public Module {
 public:
  VocabParallelEmbedding(int64_t vocab, int64_t dim, const LayerContext& context, TensorParallelGroup tp);

  std::string type_name() const override { return "VocabParallelEmbedding"; }
  std::string settings() const override;
  // ids [...] (i32 or i64, in [0, V)) -> [..., C], the same on every rank
  Tensor forward(const Tensor& ids) override;

  Tensor weight() const { return parameter("weight"); }  // [V/N, C]
  int64_t vocab_start() const { return tp_.rank() * (vocab_ / tp_.size()); }

 private:
  int64_t vocab_;  // V, the whole vocabulary
  int64_t dim_;
  TensorParallelGroup tp_;
};

}  // namespace weft
