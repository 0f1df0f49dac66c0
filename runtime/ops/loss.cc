// Differentiable cross-entropy (see loss.h).
#include "runtime/ops/loss.h"

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/reduction.h"

namespace weft {
namespace {

class CrossEntropyFunction final : public autograd::Function {
 public:
  CrossEntropyFunction(int64_t ignore_index, int64_t counted_rows)
      : ignore_index_(ignore_index), counted_(counted_rows) {}
  std::string name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor logits = inputs[0].contiguous();
    const Tensor targets = inputs[1].contiguous();
    const int64_t rows = logits.size(0);
    const DType statistic = statistic_dtype(logits.dtype());
    Tensor losses = Tensor::empty({rows}, statistic, logits.device());
    Tensor lse = Tensor::empty({rows}, statistic, logits.device());
    backend_for(logits.device()).cross_entropy(logits, targets, ignore_index_, losses, lse);
    // The mean is over rows that count; unless the caller gave it, the count is read from the
    // targets on the host.
    if (counted_ < 0) {
      counted_ = 0;
      for (double target : targets.to_vector()) counted_ += static_cast<int64_t>(target) != ignore_index_;
    }
    save_for_backward({logits, targets, lse});
    Tensor total = sum(losses);
    return {counted_ > 0 ? scale(total, 1.0 / static_cast<double>(counted_)) : total};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& logits = saved()[0];
    const Tensor& lse = saved()[2];
    const int64_t rows = logits.size(0);
    // Every counted row receives grad / count (ignored rows are zeroed by the kernel).
    Tensor grad_losses = Tensor::empty({rows}, lse.dtype(), lse.device());
    backend_for(lse.device()).affine(grads[0].to(lse.dtype()).expand({rows}),
                                     counted_ > 0 ? 1.0 / static_cast<double>(counted_) : 0.0, 0.0, grad_losses);
    // The gradient overwrites the logits when nothing can read them again (the graph frees them
    // right after this backward and no other tensor shares their bytes): one [N, V] buffer less at
    // the step's memory peak, the head's backward (823 MB for GPT-2's vocabulary at 8192 rows in
    // bf16). The kernels read each element before writing it, so in place is exact.
    const bool overwrite = autograd::backward_frees_saved_tensors() && logits.storage().use_count() == 1 &&
                           logits.is_contiguous();
    Tensor grad_logits = overwrite ? logits : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    backend_for(logits.device()).cross_entropy_backward(logits, saved()[1], lse, ignore_index_, grad_losses,
                                                        grad_logits);
    return {grad_logits, Tensor()};
  }

 private:
  int64_t ignore_index_;
  int64_t counted_;  // rows whose target is not ignore_index; -1 until counted
};

// The fused form: forward computes the loss and the gradient for the expected seed in one
// backend call, the gradient over the logits' bytes; backward hands that gradient on, rescaled on
// the device when the seed that arrived is not the expected one.
class CrossEntropyWithGradientFunction final : public autograd::Function {
 public:
  CrossEntropyWithGradientFunction(int64_t ignore_index, int64_t counted_rows, double expected_gradient)
      : ignore_index_(ignore_index), counted_(counted_rows), expected_gradient_(expected_gradient) {}
  std::string name() const override { return "CrossEntropyWithGradientBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor logits = inputs[0].contiguous();  // [N, V]; written over with the gradient
    const Tensor targets = inputs[1].contiguous();
    const int64_t rows = logits.size(0);
    const DType statistic = statistic_dtype(logits.dtype());
    Tensor losses = Tensor::empty({rows}, statistic, logits.device());
    Tensor lse = Tensor::empty({rows}, statistic, logits.device());
    // What the unfused backward computes for the expected seed, the same way: the seed in the
    // statistics' dtype, times 1 / count.
    Tensor grad_losses = Tensor::empty({rows}, statistic, logits.device());
    Backend& backend = backend_for(logits.device());
    backend.affine(Tensor::full({1}, expected_gradient_, statistic, logits.device()).expand({rows}),
                   counted_ > 0 ? 1.0 / static_cast<double>(counted_) : 0.0, 0.0, grad_losses);
    backend.cross_entropy_with_gradient(logits, targets, ignore_index_, grad_losses, losses, lse, logits);
    save_for_backward({logits});
    Tensor total = sum(losses);
    return {counted_ > 0 ? scale(total, 1.0 / static_cast<double>(counted_)) : total};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    // With retain_graph a second backward must find the gradient as the forward left it.
    Tensor grad_logits = autograd::backward_frees_saved_tensors() ? saved()[0] : saved()[0].clone();
    const Tensor seed = grad_or_zeros(grads, 0).to(grad_logits.device()).contiguous();
    backend_for(grad_logits.device()).rescale_unless_expected(grad_logits, seed, expected_gradient_);
    return {grad_logits, Tensor()};
  }

 private:
  int64_t ignore_index_;
  int64_t counted_;
  double expected_gradient_;
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, int64_t counted_rows) {
  ops::check_floating("cross_entropy", logits, "logits");
  ops::check_rank("cross_entropy", logits, "logits", 2);
  ops::check_index("cross_entropy", targets, "targets");
  ops::check_shape("cross_entropy", targets, "targets", {logits.size(0)});
  WEFT_CHECK(targets.device() == logits.device(), "cross_entropy: targets ", targets.describe(), " and logits ",
             logits.describe(), " are on different devices");
  WEFT_CHECK(counted_rows >= -1 && counted_rows <= logits.size(0), "cross_entropy: counted_rows = ", counted_rows,
             " for ", logits.size(0), " rows; give the number of targets that are not ignore_index, or -1");
  return autograd::apply<CrossEntropyFunction>({logits, targets}, ignore_index, counted_rows)[0];
}

Tensor cross_entropy_overwriting_logits(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                        int64_t counted_rows, double expected_gradient) {
  ops::check_floating("cross_entropy_overwriting_logits", logits, "logits");
  ops::check_rank("cross_entropy_overwriting_logits", logits, "logits", 2);
  ops::check_index("cross_entropy_overwriting_logits", targets, "targets");
  ops::check_shape("cross_entropy_overwriting_logits", targets, "targets", {logits.size(0)});
  WEFT_CHECK(targets.device() == logits.device(), "cross_entropy_overwriting_logits: targets ", targets.describe(),
             " and logits ", logits.describe(), " are on different devices");
  WEFT_CHECK(counted_rows >= 0 && counted_rows <= logits.size(0), "cross_entropy_overwriting_logits: counted_rows = ",
             counted_rows, " for ", logits.size(0), " rows; give the number of targets that are not ignore_index");
  WEFT_CHECK(expected_gradient != 0.0, "cross_entropy_overwriting_logits: expected_gradient must not be 0");
  // Without a backward to come, the plain loss (nothing to compute ahead, the logits kept).
  if (!autograd::grad_mode_enabled() || !logits.requires_grad()) {
    return cross_entropy(logits, targets, ignore_index, counted_rows);
  }
  return autograd::apply<CrossEntropyWithGradientFunction>({logits, targets}, ignore_index, counted_rows,
                                                           expected_gradient)[0];
}

}  // namespace weft
