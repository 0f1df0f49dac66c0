// CausalSelfAttention (attention.h).
#include "layers/attention.h"

#include "layers/rope.h"
#include "runtime/autograd/recompute.h"
#include "runtime/error.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/concat.h"

namespace weft {

CausalSelfAttention::CausalSelfAttention(const LayerContext& context)
    : dim_(context.config.dim),
      heads_(context.config.heads),
      kv_heads_(context.config.kv_heads > 0 ? context.config.kv_heads : context.config.heads),
      head_dim_(heads_ > 0 ? dim_ / heads_ : 0),
      seq_len_(context.config.seq_len),
      rope_(context.config.positions == "rope"),
      release_rotated_(context.config.recompute == "selective" && rope_),
      // Taken before any weight is drawn: unique to this layer, consumes no offsets.
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  WEFT_CHECK(heads_ >= 1 && dim_ % heads_ == 0, "CausalSelfAttention: model.heads = ", heads_,
             " does not divide model.dim = ", dim_);
  WEFT_CHECK(heads_ % kv_heads_ == 0, "CausalSelfAttention: model.kv_heads = ", kv_heads_,
             " does not divide model.heads = ", heads_);
  WEFT_CHECK(config.positions == "rope" || config.positions == "learned",
             "CausalSelfAttention: model.positions = '", config.positions, "' is not one of: learned, rope");
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim_, (heads_ + 2 * kv_heads_) * head_dim_, config.bias,
                                                         context));
  projection_ = register_module(
      "proj", std::make_shared<Linear>(dim_, dim_, config.bias, context, residual_init_std(config)));
  if (rope_) {
    const auto [cos, sin] = rotary_tables(seq_len_, head_dim_, config.rope_theta);  // [seq_len, D] f64
    register_buffer("rope_cos", cos, kFloat32);
    register_buffer("rope_sin", sin, kFloat32);
  }
}

std::string CausalSelfAttention::settings() const {
  std::string out = str("heads ", heads_);
  if (kv_heads_ != heads_) out += str(", kv_heads ", kv_heads_);
  out += str(", head_dim ", head_dim_, rope_ ? ", rope" : "");
  if (dropout_.probability() > 0) out += str(", dropout ", dropout_.probability());
  return out;
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  WEFT_CHECK(x.dim() == 3 && x.size(2) == dim_, "CausalSelfAttention: input must be [B, T, ", dim_, "], got ",
             x.describe());
  const Tensor qkv = qkv_->call(x);  // [B, T, (H + 2KV) D], or this rank's heads of each
  // The sequence from the projection: under sequence parallelism x is a chunk of it, which the
  // column-parallel projection gathers.
  const int64_t time = qkv.size(1);
  WEFT_CHECK(!rope_ || time <= seq_len_, "CausalSelfAttention: sequence of ", time,
             " positions is longer than model.seq_len = ", seq_len_);
  const int64_t D = head_dim_;
  // Local head counts from the projection's width: a tensor-parallel shard holds H / tp query heads
  // and KV / tp key/value heads (whole heads of each, layers/parallel_plan.h's blocks).
  const int64_t shards = (heads_ + 2 * kv_heads_) * D / qkv.size(-1);
  const int64_t H = heads_ / shards, KV = kv_heads_ / shards;
  const Tensor cos = rope_ ? buffer("rope_cos").narrow(0, 0, time) : Tensor();  // [T, D]
  const Tensor sin = rope_ ? buffer("rope_sin").narrow(0, 0, time) : Tensor();  // [T, D]
  const Tensor merged = attention_core(qkv, H, KV, D, cos, sin, release_rotated_);  // [B, T, H D]
  return dropout_.apply(projection_->call(merged), is_training());
}

Tensor attention_core(const Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t head_dim, const Tensor& cos,
                      const Tensor& sin, bool release_rotated) {
  const int64_t batch = qkv.size(0), time = qkv.size(1);
  const int64_t H = heads, KV = kv_heads, D = head_dim;
  const std::vector<Tensor> parts = split(qkv, {H * D, KV * D, KV * D}, -1);
  const auto heads_first = [&](const Tensor& part, int64_t count) {  // -> [B, count, T, D], a view
    return part.reshape({batch, time, count, D}).permute({0, 2, 1, 3});
  };
  Tensor q = heads_first(parts[0], H);         // [B, H, T, D]
  Tensor k = heads_first(parts[1], KV);        // [B, KV, T, D]
  const Tensor v = heads_first(parts[2], KV);  // [B, KV, T, D]
  const Tensor q_projected = q, k_projected = k;
  if (cos.defined()) {
    q = apply_rotary_embedding(q_projected, cos, sin);  // heads inner in memory, as qkv's views
    k = apply_rotary_embedding(k_projected, cos, sin);
  }
  // Grouped-query attention without expanding k, v: query head h reads kv head h / (H / KV).
  Tensor attended = causal_attention(q, k, v);  // [B, H, T, D]
  if (release_rotated && cos.defined()) {
    // train.recompute selective: the rotated q and k are attention's only tensors of its own (v is
    // a view of qkv, the output is the projection's input, the statistics are small); freed once
    // attention has read them, rotated again from qkv's views in backward.
    attended = autograd::release_until_backward(attended, q, [q_in = q_projected.detach(), cos, sin] {
      return apply_rotary_embedding(q_in, cos, sin);
    });
    attended = autograd::release_until_backward(attended, k, [k_in = k_projected.detach(), cos, sin] {
      return apply_rotary_embedding(k_in, cos, sin);
    });
  }
  return attended.permute({0, 2, 1, 3}).reshape({batch, time, H * D});  // [B, T, H D]
}

std::vector<ParallelPlanEntry> CausalSelfAttention::tensor_parallel_plan() const {
  // Whole heads of q, k and v per rank: the fused projection's rows are three blocks.
  return {{"qkv", ParallelStyle::kColumn, {heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_}},
          {"proj", ParallelStyle::kRow, {}},
          {"", ParallelStyle::kSequence, {}}};
}

WEFT_REGISTER_LAYER("causal_self_attention",
                    [](const LayerContext& context) { return std::make_shared<CausalSelfAttention>(context); });

}  // namespace weft
