// Linear: y = x W^T + b, the layer of torch.nn.Linear; TiedLinear: the same with another layer's
// weight (a GPT's output projection reading the token embedding); LinearLayer: what both are to a
// tensor-parallel plan (layers/parallel_plan.h), which splits them column- or row-wise.
//
// weight [out, in] ~ N(0, init_std) drawn from Philox(config.seed) at the context's next offsets
// (so the draw order is the construction order); bias [out] starts at zero and is absent when
// `bias` is false. Parameters are created in f32 (Module::to converts). With set_gelu(), the
// layer computes gelu(x W^T + b) as one op (on CUDA the bias and GELU ride the GEMM's epilogue).
// Sizes are read from the weight at call time, so a layer whose weight is a tensor-parallel shard
// computes with the shard's sizes.
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

// The init std of a projection that writes into the residual stream: init_std / sqrt(2 * layers),
// GPT-2's scaling, since each block adds two such outputs to the stream.
double residual_init_std(const ModelConfig& config);

class LinearLayer : public Module {
 public:
  virtual Tensor weight() const = 0;  // [out, in]
  virtual Tensor bias() const = 0;    // [out], undefined without bias
  // Whether weight() is this layer's own parameter (a TiedLinear's belongs to another layer).
  virtual bool owns_weight() const = 0;
  bool gelu() const { return gelu_; }
  void set_gelu(bool gelu = true) { gelu_ = gelu; }
  // x [..., in] -> [..., out]: linear, or linear_gelu with gelu().
  Tensor forward(const Tensor& x) override;
  // residual + forward(x) with the add in the product (linear_add), for a layer without gelu() whose
  // forward is not wrapped by a plan; otherwise the plain add of call(x).
  Tensor forward_adding(const Tensor& x, const Tensor& residual);

 private:
  bool gelu_ = false;
};

class Linear : public LinearLayer {
 public:
  // init_std defaults to config.init_std; output projections pass a residual-scaled one.
  Linear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context);
  Linear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context, double init_std);

  std::string type_name() const override { return "Linear"; }
  std::string settings() const override;
  Tensor weight() const override { return parameter("weight"); }  // [out, in]
  Tensor bias() const override;                                    // [out], undefined without bias
  bool owns_weight() const override { return true; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  bool has_bias_;
};

// y = x W^T with W = source.weight() read at call time (no bias, no parameter of its own): the
// output projection of a model with tied embeddings.
class TiedLinear : public LinearLayer {
 public:
  explicit TiedLinear(const Module& source) : source_(source) {}
  std::string type_name() const override { return "TiedLinear"; }
  std::string settings() const override { return "tied"; }
  Tensor weight() const override { return source_.parameter("weight"); }
  Tensor bias() const override { return Tensor(); }
  bool owns_weight() const override { return false; }

 private:
  const Module& source_;
};

}  // namespace weft
