// ColumnParallelLinear (column_parallel_linear.h).
#include "parallel/manual/column_parallel_linear.h"

#include <utility>

#include "parallel/manual/mappings.h"
#include "parallel/tensor/sharding.h"
#include "runtime/error.h"
#include "runtime/ops/matmul.h"

namespace weft {

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                           const LayerContext& context, double init_std, TensorParallelGroup tp,
                                           bool sequence_parallel, std::vector<int64_t> blocks)
    : in_features_(in_features),
      out_features_(out_features),
      has_bias_(bias),
      tp_(std::move(tp)),
      sequence_parallel_(sequence_parallel) {
  const Layout layout = Layout::split(0, std::move(blocks));
  const Tensor full = Tensor::normal({out_features, in_features}, context.config.seed,
                                     context.next_offset(static_cast<uint64_t>(in_features * out_features)), 0.0,
                                     init_std);  // [out, in], as Linear draws it
  register_parameter("weight", shard_of(full, layout, tp_.rank(), tp_.size()), layout);
  if (bias) register_parameter("bias", shard_of(Tensor::zeros({out_features}), layout, tp_.rank(), tp_.size()), layout);
}

std::string ColumnParallelLinear::settings() const {
  return str(in_features_, " -> ", out_features_, " / ", tp_.size(), has_bias_ ? ", bias" : "",
             sequence_parallel_ ? ", sequence parallel" : "");
}

Tensor ColumnParallelLinear::bias() const { return has_bias_ ? parameter("bias") : Tensor(); }

Tensor ColumnParallelLinear::input_region(const Tensor& x) const {
  return sequence_parallel_ ? gather_from_sequence_parallel_region(x, tp_) : copy_to_tensor_parallel_region(x, tp_);
}

Tensor ColumnParallelLinear::local_forward(const Tensor& input) const { return linear(input, weight(), bias()); }

}  // namespace weft
