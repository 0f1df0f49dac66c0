// RmsNorm over the last dim (Llama): x / sqrt(mean(x^2) + eps) * weight.
//
// weight [dim] starts at one; there is no bias. Registered as "rms_norm".
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"

namespace weft {

class RmsNorm : public Module {
 public:
  RmsNorm(int64_t dim, double eps);

  std::string type_name() const override { return "RmsNorm"; }
  std::string settings() const override;
  // x [..., dim] -> [..., dim]
  Tensor forward(const Tensor& x) override;
  // Row by row: sequence-split under sequence parallelism (layers/parallel_plan.h).
  std::vector<ParallelPlanEntry> tensor_parallel_plan() const override { return {{"", ParallelStyle::kSequence, {}}}; }

  Tensor weight() const { return parameter("weight"); }  // [dim]
  double eps() const { return eps_; }

 private:
  int64_t dim_;
  double eps_;
};

}  // namespace weft
