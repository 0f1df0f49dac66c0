// LayerNorm over the last dim, as torch.nn.LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias.
//
// weight [dim] starts at one, bias [dim] at zero; the bias is absent when config.bias is false.
// Registered as "layer_norm": models create their norms from config.norm through the registry.
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"

namespace weft {

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps, bool bias);

  std::string type_name() const override { return "LayerNorm"; }
  std::string settings() const override;
  // x [..., dim] -> [..., dim]
  Tensor forward(const Tensor& x) override;
  // Row by row: sequence-split under sequence parallelism (layers/parallel_plan.h).
  std::vector<ParallelPlanEntry> tensor_parallel_plan() const override { return {{"", ParallelStyle::kSequence, {}}}; }

  Tensor weight() const { return parameter("weight"); }  // [dim]
  Tensor bias() const;                                             // [dim], undefined without bias
  double eps() const { return eps_; }

 private:
  int64_t dim_;
  double eps_;
  bool has_bias_;
};

}  // namespace weft
