// ParallelAttention (parallel_attention.h).
#include "parallel/manual/parallel_attention.h"

#include "layers/attention.h"
#include "layers/linear.h"
#include "layers/rope.h"
#include "runtime/error.h"

namespace weft {

ParallelAttention::ParallelAttention(const LayerContext& context, const TensorParallelGroup& tp,
                                     bool sequence_parallel)
    : heads_(context.config.heads / tp.size()),
      kv_heads_((context.config.kv_heads > 0 ? context.config.kv_heads : context.config.heads) / tp.size()),
      head_dim_(context.config.dim / context.config.heads),
      seq_len_(context.config.seq_len),
      rope_(context.config.positions == "rope"),
      release_rotated_(context.config.recompute == "selective" && rope_),
      dropout_(context.config.dropout, context.config.seed, context.next_offset(0)) {  // as CausalSelfAttention
  register_random_stream("dropout", &dropout_);
  const ModelConfig& config = context.config;
  const int64_t size = tp.size(), dim = config.dim, D = head_dim_;
  const int64_t H = config.heads, KV = config.kv_heads > 0 ? config.kv_heads : H;
  WEFT_CHECK(H % size == 0 && KV % size == 0, "ParallelAttention: parallel.tp = ", size,
             " must divide model.heads = ", H, " and model.kv_heads = ", KV);
  qkv_ = register_module("qkv", std::make_shared<ColumnParallelLinear>(dim, (H + 2 * KV) * D, config.bias, context,
                                                                       config.init_std, tp, sequence_parallel,
                                                                       std::vector<int64_t>{H * D, KV * D, KV * D}));
  projection_ = register_module("proj", std::make_shared<RowParallelLinear>(dim, dim, config.bias, context,
                                                                            residual_init_std(config), tp,
                                                                            sequence_parallel));
  if (rope_) {
    const auto [cos, sin] = rotary_tables(seq_len_, D, config.rope_theta);  // [seq_len, D] f64
    register_buffer("rope_cos", cos, kFloat32);
    register_buffer("rope_sin", sin, kFloat32);
  }
}

std::string ParallelAttention::settings() const {
  std::string out = str("local heads ", heads_);
  if (kv_heads_ != heads_) out += str(", local kv_heads ", kv_heads_);
  out += str(", head_dim ", head_dim_, rope_ ? ", rope" : "");
  if (dropout_.probability() > 0) out += str(", dropout ", dropout_.probability());
  return out;
}

Tensor ParallelAttention::forward(const Tensor& x) {
  const Tensor qkv = qkv_->forward(x);  // [B, T, (H + 2 KV) D / N], the whole sequence
  const int64_t time = qkv.size(1);
  WEFT_CHECK(!rope_ || time <= seq_len_, "ParallelAttention: sequence of ", time,
             " positions is longer than model.seq_len = ", seq_len_);
  const int64_t H = heads_, KV = kv_heads_, D = head_dim_;
  // The core, qkv -> merged heads, between the two collectives (as in CausalSelfAttention; under
  // train.recompute selective the rotated q and k are rebuilt in backward, no collective reruns).
  const Tensor cos = rope_ ? buffer("rope_cos").narrow(0, 0, time) : Tensor();  // [T, D]
  const Tensor sin = rope_ ? buffer("rope_sin").narrow(0, 0, time) : Tensor();  // [T, D]
  const Tensor merged = attention_core(qkv, H, KV, D, cos, sin, release_rotated_);  // [B, T, C/N]
  return dropout_.apply(projection_->forward(merged), is_training());
}

}  // namespace weft
