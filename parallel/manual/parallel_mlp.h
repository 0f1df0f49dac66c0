// The transformer's feed-forward layers with the hidden width split over the tp group (Megatron's
// ParallelMLP), for the manual comm mode; names and weight draws as layers/mlp.h.
//
// ParallelGeluMlp:   x [B, T, C] -> fc: column [hidden/N, C], GELU fused (linear_gelu)
//                    -> proj: row [C, hidden/N] -> [B, T, C] -> dropout
// ParallelSwigluMlp: x -> one input_region, shared by gate and up: column [hidden/N, C] each
//                    -> silu(gate) * up [B, T, hidden/N] -> down: row [C, hidden/N] -> dropout
// Sequence parallel: x and the output are [B, T/N, C]; the column layers gather the input and the
// row layer reduce-scatters the output. N must divide the hidden width.
// config.recompute selective: the hidden activation is rebuilt in backward, as in layers/mlp.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/dropout_stream.h"
#include "layers/module.h"
#include "layers/registry.h"
#include "parallel/manual/column_parallel_linear.h"
#include "parallel/manual/row_parallel_linear.h"

namespace weft {

class ParallelGeluMlp : public Module {
 public:
  ParallelGeluMlp(const LayerContext& context, const TensorParallelGroup& tp, bool sequence_parallel);
  std::string type_name() const override { return "ParallelGeluMlp"; }
  // x [B, T, C] -> [B, T, C] (sequence parallel: [B, T/N, C])
  Tensor forward(const Tensor& x) override;

 private:
  bool release_hidden_;                            // config.recompute == "selective"
  std::shared_ptr<ColumnParallelLinear> fc_;       // [hidden/N, C]
  std::shared_ptr<RowParallelLinear> projection_;  // [C, hidden/N]
  DropoutStream dropout_;
};

class ParallelSwigluMlp : public Module {
 public:
  ParallelSwigluMlp(const LayerContext& context, const TensorParallelGroup& tp, bool sequence_parallel);
  std::string type_name() const override { return "ParallelSwigluMlp"; }
  // x [B, T, C] -> [B, T, C] (sequence parallel: [B, T/N, C])
  Tensor forward(const Tensor& x) override;

 private:
  bool release_hidden_;                         // config.recompute == "selective"
  std::shared_ptr<ColumnParallelLinear> gate_;  // [hidden/N, C]
  std::shared_ptr<ColumnParallelLinear> up_;    // [hidden/N, C]
  std::shared_ptr<RowParallelLinear> down_;     // [C, hidden/N]
  DropoutStream dropout_;
};

// Throws unless config.mlp has a parallel version here (gelu_mlp, swiglu_mlp), saying that the manual
// mode has none and that comm.mode: auto parallelizes a layer from its declared layout.
void check_parallel_mlp(const ModelConfig& config);
// The parallel version of config.mlp (check_parallel_mlp).
std::shared_ptr<Module> make_parallel_mlp(const LayerContext& context, const TensorParallelGroup& tp,
                                          bool sequence_parallel);

}  // namespace weft
