// Embedding: a table of vectors looked up by token id, as torch.nn.Embedding.
//
// weight [vocab, dim] ~ N(0, init_std) from Philox(config.seed) at the context's next offsets.
// A GPT ties its output projection to this weight (layers/gpt.h).
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, const LayerContext& context);

  std::string type_name() const override { return "Embedding"; }
  std::string settings() const override;
  // ids [...] (i32 or i64, each in [0, vocab)) -> [..., dim]
  Tensor forward(const Tensor& ids) override;

  Tensor weight() const { return parameter("weight"); }  // [vocab, dim]
  int64_t vocab() const { return vocab_; }
  int64_t dim() const { return dim_; }

 private:
  int64_t vocab_;
  int64_t dim_;
};

}  // namespace weft
