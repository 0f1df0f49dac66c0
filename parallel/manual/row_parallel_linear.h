// RowParallelLinear: y = x W^T + b with W's input columns split over the tp group (Megatron's
// RowParallelLinear, input_is_parallel = true).
//
//   weight [out, in/N]  Split(1);  bias [out]  Replicate, added once after the reduction
//   x [..., in/N] (a column-parallel layer's output) -> x W_r^T, a partial sum
//     -> reduce_from_tensor_parallel_region -> [..., out] replicated
//     sequence parallel: -> reduce_scatter_to_sequence_parallel_region -> [B, T/N, out]
//
// Under sequence parallelism each rank adds the bias to its own positions only, so the bias
// gradient is a partial sum over tp (mark_partial_gradient("bias")). The weight is drawn whole as
// layers/linear.h's Linear draws it and sharded (shard_of).
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"
#include "layers/registry.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

class RowParallelLinear : public Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context,
                    double init_std, TensorParallelGroup tp, bool sequence_parallel);

  std::string type_name() const override { return "RowParallelLinear"; }
  std::string settings() const override;
  // x [..., in/N] -> [..., out] (sequence parallel: [B, T, in/N] -> [B, T/N, out])
  Tensor forward(const Tensor& x) override;

  Tensor weight() const { return parameter("weight"); }  // [out, in/N]
  Tensor bias() const;                                    // [out], undefined without bias

 private:
  int64_t in_features_;  // the full width
  int64_t out_features_;
  bool has_bias_;
  TensorParallelGroup tp_;
  bool sequence_parallel_;
};

}  // namespace weft
