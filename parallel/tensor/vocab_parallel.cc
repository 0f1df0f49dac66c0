// Vocabulary-parallel embedding and cross-entropy (vocab_parallel.h).
#include "parallel/tensor/vocab_parallel.h"

#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/function.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/reduction.h"

namespace weft {
namespace {

constexpr int64_t kExactFloatIntegers = int64_t{1} << 24;

// 1 where the integer-valued `values` lie in [low, high], else 0: relu(1 - relu(low - v) - relu(v - high)).
// Elementwise kernels only (there are no integer comparisons in the Backend), exact for integers.
Tensor in_range(const Tensor& values, double low, double high) {
  const Tensor below = relu(add_scalar(neg(values), low));  // >= 1 where v < low
  const Tensor above = relu(add_scalar(values, -high));     // >= 1 where v > high
  return relu(add_scalar(neg(add(below, above)), 1.0));
}

// columns [N] (integer-valued; -1: none) -> [N, width] with a 1 at each row's column:
// relu(1 - (c - column)^2) is 1 at c == column and 0 at every other integer c.
Tensor one_hot(const Tensor& columns, int64_t width) {
  const Tensor positions = Tensor::arange(width, columns.dtype(), columns.device()).unsqueeze(0);  // [1, width]
  return relu(add_scalar(neg(square(sub(positions, columns.unsqueeze(1)))), 1.0));
}

class VocabParallelCrossEntropyFunction final : public autograd::Function {
 public:
  VocabParallelCrossEntropyFunction(int64_t ignore_index, int64_t counted, TensorParallelGroup tp)
      : ignore_index_(ignore_index), counted_(counted), tp_(std::move(tp)) {}
  std::string name() const override { return "VocabParallelCrossEntropyBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor logits = inputs[0].to(statistic_dtype(inputs[0].dtype())).contiguous();  // [N, V/tp]
    const int64_t width = logits.size(1);
    const Tensor targets = inputs[1].to(logits.dtype());                                    // [N] global ids
    const Tensor counted = add_scalar(neg(in_range(targets, ignore_index_, ignore_index_)), 1.0);  // [N] 0 / 1
    const Tensor local = add_scalar(targets, -static_cast<double>(tp_.rank() * width));
    const Tensor inside = mul(in_range(local, 0, static_cast<double>(width - 1)), counted);  // target here
    const Tensor local_targets = add(mul(local, inside), add_scalar(inside, -1.0));  // [N] column here, or -1

    Tensor row_max = max(logits, 1).first;  // [N]
    tp_.group->all_reduce(row_max, Reduction::kMax, tp_.stream)->wait();
    Tensor sum_exp = sum(exp(sub(logits, row_max.unsqueeze(1))), {1});  // [N]
    tp_.group->all_reduce(sum_exp, Reduction::kSum, tp_.stream)->wait();
    Tensor target_logit = sum(mul(logits, one_hot(local_targets, width)), {1});  // [N], 0 off this rank
    tp_.group->all_reduce(target_logit, Reduction::kSum, tp_.stream)->wait();
    const Tensor lse = add(row_max, log(sum_exp));  // [N]

    if (counted_ < 0) {  // as cross_entropy: read the targets back when the caller did not count them
      counted_ = 0;
      for (double target : inputs[1].to_vector()) counted_ += static_cast<int64_t>(target) != ignore_index_;
    }
    save_for_backward({inputs[0], lse, counted, local_targets});  // logits as given, [N] each
    const Tensor total = sum(mul(sub(lse, target_logit), counted));
    return {counted_ > 0 ? scale(total, 1.0 / static_cast<double>(counted_)) : total};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor logits = saved()[0].to(saved()[1].dtype());  // [N, V/tp]
    const Tensor& lse = saved()[1];                            // [N]
    const double factor = counted_ > 0 ? 1.0 / static_cast<double>(counted_) : 0.0;
    const Tensor row_scale = scale(mul(saved()[2], grads[0].to(lse.dtype())), factor);  // [N], 0 where ignored
    const Tensor probabilities = exp(sub(logits, lse.unsqueeze(1)));                    // this rank's softmax columns
    const Tensor grad = mul(sub(probabilities, one_hot(saved()[3], logits.size(1))), row_scale.unsqueeze(1));
    return {grad.to(saved()[0].dtype()), Tensor()};
  }

 private:
  int64_t ignore_index_;
  int64_t counted_;      // rows whose target is not ignore_index; -1 until counted
  TensorParallelGroup tp_;
};

}  // namespace

Tensor vocab_parallel_embedding_partial(const Tensor& ids, const Tensor& weight_shard, int64_t vocab_start) {
  ops::check_index("vocab_parallel_embedding_partial", ids, "ids");
  ops::check_floating("vocab_parallel_embedding_partial", weight_shard, "weight_shard");
  ops::check_rank("vocab_parallel_embedding_partial", weight_shard, "weight_shard", 2);
  const int64_t rows = weight_shard.size(0);
  WEFT_CHECK(vocab_start >= 0 && vocab_start + rows <= kExactFloatIntegers, "vocab_parallel_embedding_partial: rows ",
             vocab_start, " .. ", vocab_start + rows, " are beyond the ids it can compare exactly (2^24)");
  WEFT_CHECK(ids.device() == weight_shard.device(), "vocab_parallel_embedding_partial: ids ", ids.describe(),
             " and weight_shard ", weight_shard.describe(), " are on different devices");
  const Tensor local = add_scalar(ids.to(kFloat32), -static_cast<double>(vocab_start));  // [...]
  const Tensor inside = in_range(local, 0, static_cast<double>(rows - 1));                 // [...] 1: in this shard
  // Ids of other shards read row 0, and the mask zeroes it (and its gradient).
  const Tensor looked_up = embedding(mul(local, inside).to(kInt64), weight_shard);  // [..., C]
  return mul(looked_up, inside.to(weight_shard.dtype()).unsqueeze(-1));
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& targets, int64_t ignore_index,
                                    int64_t counted_targets, const TensorParallelGroup& tp) {
  const char* op = "vocab_parallel_cross_entropy";
  ops::check_floating(op, logits_shard, "logits_shard");
  ops::check_rank(op, logits_shard, "logits_shard", 2);
  ops::check_index(op, targets, "targets");
  ops::check_shape(op, targets, "targets", {logits_shard.size(0)});
  WEFT_CHECK(targets.device() == logits_shard.device(), op, ": targets ", targets.describe(), " and logits_shard ",
             logits_shard.describe(), " are on different devices");
  WEFT_CHECK(logits_shard.size(1) * tp.size() <= kExactFloatIntegers, op, ": a vocabulary of ",
             logits_shard.size(1) * tp.size(), " is beyond the target ids it can compare exactly (2^24)");
  WEFT_CHECK(counted_targets >= -1 && counted_targets <= logits_shard.size(0), op, ": counted_targets = ",
             counted_targets, " for ", logits_shard.size(0), " rows; give the number of targets that are not "
             "ignore_index, or -1");
  return autograd::apply<VocabParallelCrossEntropyFunction>({logits_shard, targets}, ignore_index, counted_targets,
                                                            tp)[0];
}

}  // namespace weft
