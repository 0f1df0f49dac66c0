// Linear: y = x W^T + b, the layer of torch.nn.Linear.
//
// weight [out, in] ~ N(0, init_std) drawn from Philox(config.seed) at the context's next offsets
// (so the draw order is the construction order); bias [out] starts at zero and is absent when
// `bias` is false. Parameters are created in f32 (Module::to converts).
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

// The init std of a projection that writes into the residual stream: init_std / sqrt(2 * layers),
// GPT-2's scaling, since each block adds two such outputs to the stream.
double residual_init_std(const ModelConfig& config);

class Linear : public Module {
 public:
  // init_std defaults to config.init_std; output projections pass a residual-scaled one.
  Linear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context);
  Linear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context, double init_std);

  std::string type_name() const override { return "Linear"; }
  std::string settings() const override;
  // x [..., in] -> [..., out]
  Tensor forward(const Tensor& x) override;

  Tensor weight() const { return parameter("weight"); }  // [out, in]
  Tensor bias() const;                                             // [out], undefined without bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  bool has_bias_;
};

}  // namespace weft
