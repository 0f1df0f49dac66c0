// ParallelAttention: layers/attention.h's CausalSelfAttention with its heads split over the tp
// group (Megatron's ParallelAttention), for the manual comm mode.
//
//   x [B, T, C] (sequence parallel: [B, T/N, C])
//   -> qkv: ColumnParallelLinear [(H + 2 KV) D / N, C], Split(0) in blocks {H D, KV D, KV D}: rank r
//      holds q heads [r H/N, (r + 1) H/N) and kv heads [r KV/N, (r + 1) KV/N), whole heads of each
//   -> rope, grouped-query repeat and causal attention on the H/N local heads, exactly as the
//      one-process layer (query head h reads kv head h / (H/KV), which is local since N divides KV)
//   -> proj: RowParallelLinear [C, C/N] -> [B, T, C] (sequence parallel: reduce-scattered, [B, T/N, C])
//   -> dropout
//
// Parameter names and the weight draw order (dropout stream id, qkv, proj) are CausalSelfAttention's,
// so the shards are cut from the one-process weights. N must divide H and KV.
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

class ParallelAttention : public Module {
 public:
  ParallelAttention(const LayerContext& context, const TensorParallelGroup& tp, bool sequence_parallel);

  std::string type_name() const override { return "ParallelAttention"; }
  std::string settings() const override;
  // x [B, T, C] -> [B, T, C] (sequence parallel: [B, T/N, C] -> [B, T/N, C])
  Tensor forward(const Tensor& x) override;

 private:
  int64_t heads_;     // H / N, this rank's query heads
  int64_t kv_heads_;  // KV / N
  int64_t head_dim_;  // D
  int64_t seq_len_;   // the longest T the rope tables cover
  bool rope_;
  bool release_rotated_;  // config.recompute == "selective" with rope: rotated q, k rebuilt in backward
  std::shared_ptr<ColumnParallelLinear> qkv_;      // [(H + 2 KV) D / N, C]
  std::shared_ptr<RowParallelLinear> projection_;  // [C, C / N]
  DropoutStream dropout_;
};

}  // namespace weft
