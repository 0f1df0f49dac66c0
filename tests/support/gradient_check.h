// Gradient checks for tests: autograd against central finite differences in double precision.
//
// expect_gradients_match(function, inputs) evaluates y = function(inputs), reduces it to a scalar
// L = sum(y * w) with fixed random weights w (so every output element matters, with a different
// weight), runs backward, and compares each input's .grad element by element with
// (L(x + h) - L(x - h)) / 2h. Inputs must be f64 CPU leaf tensors; those with requires_grad are
// checked. The function may build views, broadcasts or casts inside, which are then checked too.
#pragma once

#include <functional>
#include <vector>

#include "runtime/tensor.h"

namespace weft::testing {

struct GradientCheckOptions {
  double step = 1e-6;
  double absolute_tolerance = 1e-6;
  double relative_tolerance = 1e-5;
  uint64_t weight_seed = 1234;
};

using TensorFunction = std::function<Tensor(const std::vector<Tensor>&)>;

void expect_gradients_match(const TensorFunction& function, std::vector<Tensor> inputs,
                            const GradientCheckOptions& options = {});

// A random f64 leaf tensor with requires_grad set (normal(0, 1) from Philox with this seed).
Tensor random_leaf(absl::Span<const int64_t> shape, uint64_t seed, bool requires_grad = true);

// max |a - b| / max(max |b|, 1e-30) over all elements (shapes must match); for forward checks.
double relative_error(const Tensor& actual, const Tensor& expected);
// max |a - b|.
double max_abs_difference(const Tensor& actual, const Tensor& expected);

}  // namespace weft::testing
