// Tests of the custom layer, the way weft tests its built-in ones (tests/unit/layers_test.cc):
// forwards against a plain reference, every gradient against central finite differences in f64,
// and the registration by name. Self-contained: the installed weft ships no test support.
// Prints one line per check; exits 1 if any fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/registry.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduction.h"
#include "runtime/tensor.h"
#include "squared_relu.h"
#include "squared_relu_mlp.h"

namespace {

using weft::Tensor;

int failures = 0;

void report(bool passed, const std::string& what) {
  std::printf("%s %s\n", passed ? "ok  " : "FAIL", what.c_str());
  if (!passed) ++failures;
}

// A random f64 leaf [shape] ~ N(0, 1) that requires grad.
Tensor random_leaf(std::vector<int64_t> shape, uint64_t seed) {
  return Tensor::normal(shape, seed, 0, 0.0, 1.0, weft::kFloat64).set_requires_grad(true);
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double worst = x.size() == y.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// Checks every element of every input's gradient of L = sum(function(inputs) * w), with fixed
// random weights w so every output element counts, against (L(x + h) - L(x - h)) / 2h. The inputs
// are contiguous f64 leaves, nudged in place (module parameters included, which forward reads live).
void check_gradients(const std::string& what, const std::function<Tensor()>& function,
                     const std::vector<Tensor>& inputs) {
  const Tensor output = function();
  const Tensor weights = Tensor::normal(output.shape(), 99, 0, 0.0, 1.0, weft::kFloat64);
  const auto loss = [&] { return weft::sum(weft::mul(function(), weights)); };
  for (Tensor input : inputs) input.zero_grad();  // a Tensor copy aliases the same tensor
  loss().backward();

  constexpr double kStep = 1e-6, kAbsolute = 1e-6, kRelative = 1e-5;
  weft::autograd::NoGradGuard no_grad;
  double worst = 0;  // the largest error relative to the tolerance; 1 is the limit
  for (const Tensor& input : inputs) {
    const std::vector<double> analytic = input.grad().to_vector();
    double* values = input.data<double>();
    for (int64_t i = 0; i < input.numel(); ++i) {
      const double saved = values[i];
      values[i] = saved + kStep;
      const double plus = loss().item();
      values[i] = saved - kStep;
      const double minus = loss().item();
      values[i] = saved;
      const double numeric = (plus - minus) / (2 * kStep);
      worst = std::max(worst, std::abs(analytic[i] - numeric) / (kAbsolute + kRelative * std::abs(numeric)));
    }
  }
  report(worst <= 1.0, what + weft::str(" (worst error ", worst, " of tolerance)"));
}

// dim 4, hidden 6, scale 1.5: small enough to check every weight, weights large enough that the
// activation sees both signs.
weft::ModelConfig small_config() {
  weft::ModelConfig config;
  config.dim = 4;
  config.hidden_dim = 6;
  config.heads = 2;
  config.init_std = 0.5;
  config.seed = 7;
  config.options["squared_relu_scale"] = "1.5";
  return config;
}

void test_op() {
  const Tensor x = random_leaf({3, 5}, 1);  // [3, 5]
  const Tensor y = weft_example::squared_relu(x, 1.5);
  const Tensor reference = weft::scale(weft::square(weft::relu(x)), 1.5);
  report(max_abs_difference(y, reference) < 1e-12, "squared_relu forward matches 1.5 * relu(x)^2");
  report(y.grad_fn() != nullptr && y.grad_fn()->name() == "SquaredReluBackward",
         "squared_relu records SquaredReluBackward");
  check_gradients("squared_relu gradient vs finite differences",
                  [&] { return weft_example::squared_relu(x, 1.5); }, {x});
}

void test_layer() {
  const weft::ModelConfig config = small_config();
  uint64_t offset = 0;
  const std::shared_ptr<weft::Module> created =
      weft::LayerRegistry::global().create("squared_relu_mlp", weft::LayerContext{config, &offset});
  auto mlp = std::dynamic_pointer_cast<weft_example::SquaredReluMlp>(created);
  report(mlp != nullptr, "\"squared_relu_mlp\" is registered and builds a SquaredReluMlp");
  if (!mlp) return;
  report(mlp->hidden_dim() == 6 && mlp->activation_scale() == 1.5,
         "hidden_dim and model.options.squared_relu_scale are read from the config");

  mlp->to(weft::kFloat64);
  const Tensor x = random_leaf({2, 3, 4}, 2);  // [B, T, C]
  const auto state = mlp->state_dict();
  const Tensor up = weft::linear(x, state.at("up.weight"), state.at("up.bias"));  // [B, T, hidden]
  const Tensor reference =
      weft::linear(weft::scale(weft::square(weft::relu(up)), 1.5), state.at("down.weight"), state.at("down.bias"));
  report(max_abs_difference(mlp->forward(x), reference) < 1e-12, "SquaredReluMlp forward matches its reference");

  // Biases start at zero; move every parameter off its initial value so no gradient is degenerate.
  std::map<std::string, Tensor> moved;
  uint64_t seed = 10;
  for (const auto& [name, tensor] : state) {
    moved.emplace(name, weft::add(tensor.detach(), Tensor::normal(tensor.shape(), seed++, 0, 0.0, 0.3, weft::kFloat64)));
  }
  mlp->load_state_dict(moved);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& parameter : mlp->parameters()) inputs.push_back(parameter);
  check_gradients("SquaredReluMlp gradients (input and every parameter) vs finite differences",
                  [&] { return mlp->forward(x); }, inputs);
}

}  // namespace

int main() {
  try {
    test_op();
    test_layer();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "squared_relu_test: %s\n", error.what());
    return 1;
  }
  std::printf("%s\n", failures == 0 ? "all passed" : weft::str(failures, " failed").c_str());
  return failures == 0 ? 0 : 1;
}
