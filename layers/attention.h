// CausalSelfAttention: multi-head causal self-attention with optional grouped-query heads and RoPE.
//
//   x [B, T, C] -> qkv = x Wqkv^T (+ b)               [B, T, (H + 2 KV) D], Wqkv [(H + 2 KV) D, C]
//   q [B, H, T, D], k, v [B, KV, T, D]                 (heads split off the fused projection)
//   positions == "rope": q, k rotated (layers/rope.h) with tables [seq_len, D] kept as buffers
//   k, v repeated to H heads: query head h reads kv head h / (H / KV) (repeat_interleave, as
//   Hugging Face's repeat_kv), by expand + reshape so the gradient sums over the group
//   causal_attention, heads merged [B, T, C], out = y Wproj^T (+ b), Wproj [C, C], then dropout.
//
// D = C / H; KV = config.kv_heads (0 means H) must divide H. The output projection is drawn with
// std init_std / sqrt(2 * layers) (GPT-2's scaling for the two residual writes per block).
// Dropout (config.dropout) is applied to the output in training only; the attention weights
// themselves are not dropped, since weft::causal_attention is fused and has no dropout.
// Tensor parallelism (auto mode, tensor_parallel_plan): qkv column-wise in three blocks, so each
// rank holds whole heads of q, k and v (whole kv groups with GQA), proj row-wise; the head counts
// the forward uses are read from qkv's width, so a shard attends over its own heads.
// With config.recompute selective and rope, the rotated q and k are freed once attention has read
// them and rotated again from qkv in backward (runtime/autograd/recompute.h's
// release_until_backward): they are the only tensors attention keeps of its own. The attention
// itself never reruns: the fused kernel keeps no [T, T] matrix (its backward recomputes it from the
// statistics), v is a view of qkv and the output is the projection's saved input, so a rerun would
// free nothing more. Registered as "causal_self_attention".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/dropout_stream.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

// The core of attention, qkv [B, T, (H + 2 KV) D] -> merged heads [B, T, H D]: q, k, v split off
// as views, q and k rotated when cos and sin ([T, D]) are defined, causal attention (grouped-query
// without expanding k, v), heads merged. With release_rotated (train.recompute selective) the
// rotated q and k are freed once attention has read them and rotated again in backward. Shared by
// CausalSelfAttention and the manual comm mode's ParallelAttention (on its local heads).
Tensor attention_core(const Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t head_dim, const Tensor& cos,
                      const Tensor& sin, bool release_rotated);

class CausalSelfAttention : public Module {
 public:
  // Reads dim, heads, kv_heads, positions, rope_theta, seq_len, bias, init_std, layers, dropout.
  explicit CausalSelfAttention(const LayerContext& context);

  std::string type_name() const override { return "CausalSelfAttention"; }
  std::string settings() const override;
  // x [B, T, C] -> [B, T, C], T <= seq_len
  Tensor forward(const Tensor& x) override;
  std::vector<ParallelPlanEntry> tensor_parallel_plan() const override;

  int64_t heads() const { return heads_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  bool uses_rope() const { return rope_; }

 private:
  int64_t dim_;       // C
  int64_t heads_;     // H
  int64_t kv_heads_;  // KV
  int64_t head_dim_;  // D
  int64_t seq_len_;   // the longest T the rope tables cover
  bool rope_;
  bool release_rotated_;  // config.recompute == "selective" with rope: rotated q, k rebuilt in backward
  std::shared_ptr<Linear> qkv_;         // [(H + 2 KV) D, C]
  std::shared_ptr<Linear> projection_;  // [C, C]
  DropoutStream dropout_;
};

}  // namespace weft
