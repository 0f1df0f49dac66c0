#include "tests/support/gradient_check.h"

#include <cmath>

#include "gtest/gtest.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduction.h"

namespace weft::testing {
namespace {

double projected_loss(const TensorFunction& function, const std::vector<Tensor>& inputs, const Tensor& weights) {
  autograd::NoGradGuard no_grad;
  Tensor y = function(inputs);
  return sum(mul(y.to(kFloat64), weights)).item();
}

}  // namespace

Tensor random_leaf(absl::Span<const int64_t> shape, uint64_t seed, bool requires_grad) {
  Tensor x = Tensor::normal(shape, seed, 0, 0.0, 1.0, kFloat64);
  if (requires_grad) x.set_requires_grad(true);
  return x;
}

void expect_gradients_match(const TensorFunction& function, std::vector<Tensor> inputs,
                            const GradientCheckOptions& options) {
  for (Tensor& input : inputs) {
    ASSERT_TRUE(input.device().is_cpu()) << "gradient checks run on CPU tensors";
    if (input.requires_grad()) {
      ASSERT_EQ(input.dtype(), kFloat64) << "gradient-checked inputs must be f64";
      ASSERT_TRUE(input.is_contiguous());
      input.zero_grad();
    }
  }
  Tensor y = function(inputs);
  ASSERT_TRUE(y.requires_grad()) << "the function's output does not depend on any input requiring grad";
  const Tensor weights = Tensor::normal(y.shape(), options.weight_seed, 0, 0.0, 1.0, kFloat64);
  sum(mul(y.to(kFloat64), weights)).backward();

  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& input = inputs[k];
    if (!input.requires_grad()) continue;
    Tensor analytic = input.grad();
    ASSERT_TRUE(analytic.defined()) << "input " << k << " received no gradient";
    ASSERT_EQ(analytic.shape(), input.shape()) << "input " << k;
    double* data = input.data<double>();
    int failures = 0;
    for (int64_t i = 0; i < input.numel(); ++i) {
      const double original = data[i];
      data[i] = original + options.step;
      const double plus = projected_loss(function, inputs, weights);
      data[i] = original - options.step;
      const double minus = projected_loss(function, inputs, weights);
      data[i] = original;
      const double numeric = (plus - minus) / (2 * options.step);
      const double got = analytic.contiguous().data<double>()[i];
      const double allowed = options.absolute_tolerance + options.relative_tolerance * std::fabs(numeric);
      if (!(std::fabs(got - numeric) <= allowed)) {
        ADD_FAILURE() << "input " << k << " " << input.describe() << " element " << i << ": autograd " << got
                      << " vs finite difference " << numeric;
        if (++failures >= 5) return;
      }
    }
  }
}

double max_abs_difference(const Tensor& actual, const Tensor& expected) {
  WEFT_CHECK(actual.shape() == expected.shape(), "max_abs_difference: ", actual.describe(), " vs ",
             expected.describe());
  const std::vector<double> a = actual.to_vector();
  const std::vector<double> b = expected.to_vector();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double difference = std::fabs(a[i] - b[i]);
    if (std::isnan(difference)) return INFINITY;
    worst = std::max(worst, difference);
  }
  return worst;
}

double relative_error(const Tensor& actual, const Tensor& expected) {
  double scale = 0;
  for (double value : expected.to_vector()) scale = std::max(scale, std::fabs(value));
  return max_abs_difference(actual, expected) / std::max(scale, 1e-30);
}

}  // namespace weft::testing
