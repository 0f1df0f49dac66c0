// RowParallelLinear (row_parallel_linear.h).
#include "parallel/manual/row_parallel_linear.h"

#include <utility>

#include "parallel/manual/mappings.h"
#include "parallel/tensor/sharding.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"

namespace weft {

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const LayerContext& context,
                                     double init_std, TensorParallelGroup tp, bool sequence_parallel)
    : in_features_(in_features),
      out_features_(out_features),
      has_bias_(bias),
      tp_(std::move(tp)),
      sequence_parallel_(sequence_parallel) {
  const Tensor full = Tensor::normal({out_features, in_features}, context.config.seed,
                                     context.next_offset(static_cast<uint64_t>(in_features * out_features)), 0.0,
                                     init_std);  // [out, in], as Linear draws it
  register_parameter("weight", shard_of(full, Layout::split(1), tp_.rank(), tp_.size()), Layout::split(1));
  if (bias) register_parameter("bias", Tensor::zeros({out_features}));
  if (bias && sequence_parallel_) mark_partial_gradient("bias");
}

std::string RowParallelLinear::settings() const {
  return str(in_features_, " / ", tp_.size(), " -> ", out_features_, has_bias_ ? ", bias" : "",
             sequence_parallel_ ? ", sequence parallel" : "");
}

Tensor RowParallelLinear::bias() const { return has_bias_ ? parameter("bias") : Tensor(); }

Tensor RowParallelLinear::forward(const Tensor& x) {
  if (tp_.size() == 1) return linear(x, weight(), bias());  // one rank: the plain layer, bias in the product
  const Tensor partial = linear(x, weight());  // [..., out], this rank's share of the sum
  const Tensor reduced = sequence_parallel_ ? reduce_scatter_to_sequence_parallel_region(partial, tp_)
                                            : reduce_from_tensor_parallel_region(partial, tp_);
  return has_bias_ ? add(reduced, bias()) : reduced;
}

}  // namespace weft
