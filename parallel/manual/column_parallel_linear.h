// ColumnParallelLinear: y = x W^T + b with W's output rows split over the tp group (Megatron's
// ColumnParallelLinear, gather_output = false).
//
//   weight [out/N, in]  Split(0) (in blocks, for a fused q/k/v: each block split on its own)
//   bias   [out/N]      Split(0), the same blocks
//   x [..., in] replicated -> copy_to_tensor_parallel_region -> [..., out/N] this rank's columns
//   sequence parallel: x [B, T/N, in] -> gather_from_sequence_parallel_region -> [B, T, out/N]
//
// The weight is drawn whole, exactly as layers/linear.h's Linear draws it (same Philox offsets),
// and this rank keeps shard_of(full, layout, rank, N), so a tp model starts from the one-process
// weights. Layers that feed one input to several projections (SwiGLU's gate and up) take
// input_region once and call local_forward on each, so the input is gathered (and its gradient
// reduced) once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/module.h"
#include "layers/registry.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

class ColumnParallelLinear : public Module {
 public:
  // blocks: sizes of out's blocks, each split evenly over tp (empty: one block).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context,
                       double init_std, TensorParallelGroup tp, bool sequence_parallel,
                       std::vector<int64_t> blocks = {});

  std::string type_name() const override { return "ColumnParallelLinear"; }
  std::string settings() const override;
  // x [..., in] (sequence parallel: [B, T/N, in]) -> [..., out/N]
  Tensor forward(const Tensor& x) override { return local_forward(input_region(x)); }
  // The input every rank's shard multiplies: x, or the whole sequence under sequence parallelism.
  Tensor input_region(const Tensor& x) const;
  // input [..., in] (already through input_region) -> [..., out/N]
  Tensor local_forward(const Tensor& input) const;

  Tensor weight() const { return parameter("weight"); }  // [out/N, in]
  Tensor bias() const;                                    // [out/N], undefined without bias

 private:
  int64_t in_features_;
  int64_t out_features_;  // the full width
  bool has_bias_;
  TensorParallelGroup tp_;
  bool sequence_parallel_;
};

}  // namespace weft
