// Differentiable causal self-attention (see attention.h).
#include "runtime/ops/attention.h"

#include <cmath>

#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/rotary.h"

namespace weft {
namespace {

// Backends take [B, H, T, D] views with unit stride in D (backend.h), so the heads of the layer's
// q, k, v projection go in without a copy; anything else is made contiguous first.
Tensor with_unit_row_stride(const Tensor& tensor) {
  return tensor.size(3) <= 1 || tensor.stride(3) == 1 ? tensor : tensor.contiguous();
}

// A [B, H, T, D] result stored in [B, T, H, D] order, so that merging the heads back into
// [B, T, H * D] (the layer's next step) is a view, not a copy.
Tensor empty_heads_last(const Tensor& like) {
  return Tensor::empty({like.size(0), like.size(2), like.size(1), like.size(3)}, like.dtype(), like.device())
      .permute({0, 2, 1, 3});
}

class AttentionFunction final : public autograd::Function {
 public:
  explicit AttentionFunction(double scale) : scale_(scale) {}
  std::string name() const override { return "CausalAttentionBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor q = with_unit_row_stride(inputs[0]), k = with_unit_row_stride(inputs[1]),
                 v = with_unit_row_stride(inputs[2]);
    Tensor out = empty_heads_last(q);
    Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, statistic_dtype(q.dtype()),
                               q.device());
    backend_for(q.device()).attention(q, k, v, scale_, out, lse);
    save_for_backward({q, k, v, out, lse});
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const std::vector<Tensor>& s = saved();
    // In [B, T, heads, D] order, like the output, and all three in one [B, T, H + 2 KV, D] buffer:
    // where q, k, v were the heads of one projection's output (a layer's qkv, split), the split's
    // backward finds the three gradients already laid out as the projection's gradient and takes
    // the buffer as it is (ops/concat.cc), with no concatenating copy. grad_k, grad_v have k's KV
    // heads.
    const int64_t heads = s[0].size(1), kv_heads = s[1].size(1);
    const Tensor joined = Tensor::empty({s[0].size(0), s[0].size(2), heads + 2 * kv_heads, s[0].size(3)},
                                        s[0].dtype(), s[0].device());
    const auto heads_of = [&](int64_t first, int64_t count) {  // -> [B, count, T, D]
      return joined.narrow(2, first, count).permute({0, 2, 1, 3});
    };
    Tensor grad_q = heads_of(0, heads), grad_k = heads_of(heads, kv_heads);
    Tensor grad_v = heads_of(heads + kv_heads, kv_heads);
    backend_for(s[0].device()).attention_backward(s[0], s[1], s[2], s[3], s[4], with_unit_row_stride(grads[0]),
                                                  scale_, grad_q, grad_k, grad_v);
    // Llama's q and k arrive rotated (rotary_embedding): their transpose is applied here, in place in
    // `joined`, so the q and k gradients reach the split still laid out as the projection's.
    unrotate_gradient_in_place(next_edges[0], grad_q);
    unrotate_gradient_in_place(next_edges[1], grad_k);
    return {grad_q, grad_k, grad_v};
  }

 private:
  double scale_;
};

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  ops::check_floating("causal_attention", q, "q");
  ops::check_rank("causal_attention", q, "q", 4);
  ops::check_compatible("causal_attention", q, "q", k, "k");
  ops::check_compatible("causal_attention", q, "q", v, "v");
  ops::check_rank("causal_attention", k, "k", 4);
  const int64_t kv_heads = k.size(1);
  ops::check_shape("causal_attention", k, "k", {q.size(0), kv_heads, q.size(2), q.size(3)});
  ops::check_shape("causal_attention", v, "v", k.shape());
  WEFT_CHECK(kv_heads >= 1 && q.size(1) % kv_heads == 0, "causal_attention: the ", kv_heads,
             " kv heads of k ", k.describe(), " must divide the ", q.size(1), " query heads of q ", q.describe(),
             " (grouped-query attention: query head h reads kv head h / (H / KV))");
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  return autograd::apply<AttentionFunction>({q, k, v}, scale)[0];
}

}  // namespace weft
