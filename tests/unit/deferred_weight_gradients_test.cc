// Deferred weight gradients (runtime/autograd/deferred_weight_gradients.h), the W half of a
// zero-bubble pipeline's split backward: under DeferWeightGradients a linear layer's backward hands
// back the input gradient only, and DeferredWeightGradients::run() later gives every parameter
// bitwise the gradient an undeferred backward gives, through its AccumulateGrad (so .grad
// accumulates and grad-ready hooks fire then, once per parameter, and not before).
//
// The model is a small MLP made of the ops layers/linear.cc calls: linear_gelu with a bias, linear
// with a bias, and a linear without a bias (a head, a Llama's projections); all three are deferred.
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"

namespace weft {
namespace {

using autograd::current_weight_gradient_deferral;
using autograd::DeferredWeightGradients;
using autograd::DeferWeightGradients;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.numel() * x.element_size())) == 0;
}

Tensor random_values(absl::Span<const int64_t> shape, uint64_t seed, DType dtype, Device device) {
  return Tensor::uniform(shape, seed, 0, -1.0, 1.0, dtype, device);
}

Tensor leaf(absl::Span<const int64_t> shape, uint64_t seed, DType dtype, Device device) {
  return random_values(shape, seed, dtype, device).set_requires_grad(true);
}

// x [2, 3, 4] -> linear_gelu(w1 [5, 4], b1 [5]) -> linear(w2 [6, 5], b2 [6]) -> linear(w3 [3, 6]),
// the loss being the sum of the output times fixed random weights (so that every element matters).
// Two Mlp made with the same arguments hold the same values.
struct Mlp {
  Mlp(DType dtype, Device device)
      : x(leaf({2, 3, 4}, 1, dtype, device)),
        w1(leaf({5, 4}, 2, dtype, device)),
        b1(leaf({5}, 3, dtype, device)),
        w2(leaf({6, 5}, 4, dtype, device)),
        b2(leaf({6}, 5, dtype, device)),
        w3(leaf({3, 6}, 6, dtype, device)),
        loss_weights(random_values({2, 3, 3}, 7, dtype, device)) {
    for (auto [parameter, name] : {std::pair{&w1, "w1"}, std::pair{&b1, "b1"}, std::pair{&w2, "w2"},
                                   std::pair{&b2, "b2"}, std::pair{&w3, "w3"}}) {
      parameter->register_grad_ready_hook([this, name = std::string(name)](Tensor& parameter_leaf) {
        hook_calls[name] += 1;
        grad_seen_by_hook[name] = parameter_leaf.grad().clone();
      });
    }
  }

  // The hooks hold `this`.
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  Tensor loss(const Tensor& input) const {
    const Tensor hidden = linear_gelu(input, w1, b1);  // [2, 3, 5]
    const Tensor features = linear(hidden, w2, b2);     // [2, 3, 6]
    return sum(linear(features, w3) * loss_weights);    // w3 has no bias
  }
  Tensor loss() const { return loss(x); }

  // The parameters of the layers that defer (those with a bias), and every parameter.
  std::vector<std::pair<std::string, Tensor>> deferred_parameters() const {
    return {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}, {"w3", w3}};
  }
  std::vector<std::pair<std::string, Tensor>> parameters() const { return deferred_parameters(); }

  Tensor x, w1, b1, w2, b2, w3;
  Tensor loss_weights;  // [2, 3, 3]
  std::map<std::string, int> hook_calls;
  std::map<std::string, Tensor> grad_seen_by_hook;  // .grad as the latest hook call saw it
};

// Every gradient of `deferred` (input and parameters) is bitwise that of `reference`.
void expect_same_gradients(const Mlp& deferred, const Mlp& reference) {
  EXPECT_TRUE(bitwise_equal(deferred.x.grad(), reference.x.grad())) << "x";
  for (const auto& [name, parameter] : deferred.parameters()) {
    const Tensor& reference_parameter = name == "w1"   ? reference.w1
                                        : name == "b1" ? reference.b1
                                        : name == "w2" ? reference.w2
                                        : name == "b2" ? reference.b2
                                                       : reference.w3;
    EXPECT_TRUE(bitwise_equal(parameter.grad(), reference_parameter.grad())) << name;
  }
}

const DType kDtypes[] = {kFloat32, kFloat64};

// --- Results ----------------------------------------------------------------------------------

TEST(DeferredWeightGradients, MatchAnUndeferredBackwardBitForBit) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Mlp reference(dtype, Device::cpu()), deferred(dtype, Device::cpu());
    reference.loss().backward();
    DeferredWeightGradients weight_work;
    {
      DeferWeightGradients defer(weight_work);
      deferred.loss().backward();
    }
    EXPECT_EQ(weight_work.size(), 3u) << "one item per linear layer";
    weight_work.run();
    EXPECT_TRUE(weight_work.empty());
    expect_same_gradients(deferred, reference);
  }
}

// BiasGradients::kWithInputGradients (weight gradients on a second stream): the biases' sums are
// taken in the backward, as without a deferral, and handed on by the items; the weights and biases
// still wait for run(), and every gradient is bitwise the undeferred one.
TEST(DeferredWeightGradients, BiasesTakenWithTheInputGradientMatchBitForBit) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Mlp reference(dtype, Device::cpu()), deferred(dtype, Device::cpu());
    reference.loss().backward();
    DeferredWeightGradients weight_work(DeferredWeightGradients::BiasGradients::kWithInputGradients);
    {
      DeferWeightGradients defer(weight_work);
      EXPECT_FALSE(autograd::bias_gradients_deferred());
      deferred.loss().backward();
    }
    EXPECT_EQ(weight_work.size(), 3u) << "one item per linear layer";
    for (const auto& [name, parameter] : deferred.deferred_parameters()) {
      EXPECT_FALSE(parameter.grad().defined()) << name << " before run()";
    }
    weight_work.run();
    expect_same_gradients(deferred, reference);
  }
  DeferredWeightGradients zero_bubble;
  DeferWeightGradients defer(zero_bubble);
  EXPECT_TRUE(autograd::bias_gradients_deferred());
}

// run(&ran) keeps each item that ran, and what it owns, until the caller lets go.
TEST(DeferredWeightGradients, RunKeepsTheItemsThatRanWhereAsked) {
  DeferredWeightGradients work;
  auto owned = std::make_shared<int>(0);
  work.add([owned] { *owned += 1; });
  work.add([owned] { *owned += 2; });
  std::vector<std::function<void()>> ran;
  work.run(&ran);
  EXPECT_TRUE(work.empty());
  EXPECT_EQ(*owned, 3);
  EXPECT_EQ(ran.size(), 2u);
  EXPECT_EQ(owned.use_count(), 3) << "both items still hold what they captured";
  ran.clear();
  EXPECT_EQ(owned.use_count(), 1);
}

// One deferred backward of `deferred` next to an undeferred one of `reference`: the input gradient
// is final at once, no parameter's .grad or hook has moved, and run() is left to the caller.
void expect_input_gradient_before_weights(Mlp& reference, Mlp& deferred, DeferredWeightGradients& weight_work) {
  reference.loss().backward();
  {
    DeferWeightGradients defer(weight_work);
    deferred.loss().backward();
  }
  EXPECT_TRUE(bitwise_equal(deferred.x.grad(), reference.x.grad()));
  for (const auto& [name, parameter] : deferred.deferred_parameters()) {
    EXPECT_FALSE(parameter.grad().defined()) << name;
    EXPECT_EQ(deferred.hook_calls[name], 0) << name;
  }
  EXPECT_EQ(weight_work.size(), 3u) << "one item per linear layer";
}

TEST(DeferredWeightGradients, ParametersWaitForRunWhileTheInputGradientIsComplete) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Mlp reference(dtype, Device::cpu()), deferred(dtype, Device::cpu());
    DeferredWeightGradients weight_work;
    // B is done: the input gradient is final before any weight work runs.
    expect_input_gradient_before_weights(reference, deferred, weight_work);

    weight_work.run();
    for (const auto& [name, parameter] : deferred.parameters()) {
      EXPECT_EQ(deferred.hook_calls[name], 1) << name;
      // Inside its hook .grad was already final.
      EXPECT_TRUE(bitwise_equal(deferred.grad_seen_by_hook[name], parameter.grad())) << name;
    }
    expect_same_gradients(deferred, reference);

    // A second pass accumulates onto the existing .grad, which stays as it was until run().
    std::map<std::string, Tensor> after_first_pass;
    for (const auto& [name, parameter] : deferred.deferred_parameters()) after_first_pass[name] = parameter.grad().clone();
    reference.loss().backward();
    {
      DeferWeightGradients defer(weight_work);
      deferred.loss().backward();
    }
    for (const auto& [name, parameter] : deferred.deferred_parameters()) {
      EXPECT_TRUE(bitwise_equal(parameter.grad(), after_first_pass[name])) << name;
      EXPECT_EQ(deferred.hook_calls[name], 1) << name;
    }
    weight_work.run();
    for (const auto& [name, parameter] : deferred.parameters()) EXPECT_EQ(deferred.hook_calls[name], 2) << name;
    expect_same_gradients(deferred, reference);
  }
}

TEST(DeferredWeightGradients, AWeightOrBiasThatIsNotALeafIsNotDeferred) {
  // The f32 leaves reach the f64 layer through a conversion (as a gathered or cast weight would),
  // or through an op: their gradient must flow through that node during the backward.
  struct Case {
    const char* name;
    bool weight_through_op;  // else the bias is
    bool convert;            // .to(kFloat64) of an f32 leaf, else * 1.0
  };
  for (const Case& test_case : {Case{"weight.to(f64)", true, true}, Case{"weight * 1", true, false},
                                Case{"bias.to(f64)", false, true}, Case{"bias * 1", false, false}}) {
    SCOPED_TRACE(test_case.name);
    const DType leaf_dtype = test_case.convert ? kFloat32 : kFloat64;
    auto make_loss = [&](const Tensor& x, const Tensor& weight, const Tensor& bias) {
      auto through_op = [&](const Tensor& parameter) {
        return test_case.convert ? parameter.to(kFloat64) : parameter * 1.0;
      };
      const Tensor used_weight = test_case.weight_through_op ? through_op(weight) : weight;
      const Tensor used_bias = test_case.weight_through_op ? bias : through_op(bias);
      return sum(square(linear(x, used_weight, used_bias)));
    };
    auto weight_dtype = test_case.weight_through_op ? leaf_dtype : kFloat64;
    auto bias_dtype = test_case.weight_through_op ? kFloat64 : leaf_dtype;
    const Device cpu = Device::cpu();
    Tensor x = leaf({3, 4}, 10, kFloat64, cpu), weight = leaf({2, 4}, 11, weight_dtype, cpu),
           bias = leaf({2}, 12, bias_dtype, cpu);
    Tensor x_reference = leaf({3, 4}, 10, kFloat64, cpu), weight_reference = leaf({2, 4}, 11, weight_dtype, cpu),
           bias_reference = leaf({2}, 12, bias_dtype, cpu);
    make_loss(x_reference, weight_reference, bias_reference).backward();
    DeferredWeightGradients weight_work;
    {
      DeferWeightGradients defer(weight_work);
      make_loss(x, weight, bias).backward();
    }
    EXPECT_TRUE(weight_work.empty());
    EXPECT_TRUE(bitwise_equal(x.grad(), x_reference.grad()));
    EXPECT_TRUE(bitwise_equal(weight.grad(), weight_reference.grad()));
    EXPECT_TRUE(bitwise_equal(bias.grad(), bias_reference.grad()));
  }
}

TEST(DeferredWeightGradients, ABiasWithoutGradientStillDefersTheWeight) {
  const Device cpu = Device::cpu();
  Tensor x = leaf({3, 4}, 20, kFloat64, cpu), weight = leaf({2, 4}, 21, kFloat64, cpu);
  const Tensor bias = random_values({2}, 22, kFloat64, cpu);  // a constant: no edge
  Tensor x_reference = leaf({3, 4}, 20, kFloat64, cpu), weight_reference = leaf({2, 4}, 21, kFloat64, cpu);
  sum(square(linear_gelu(x_reference, weight_reference, bias))).backward();
  DeferredWeightGradients weight_work;
  {
    DeferWeightGradients defer(weight_work);
    sum(square(linear_gelu(x, weight, bias))).backward();
  }
  EXPECT_EQ(weight_work.size(), 1u);
  EXPECT_FALSE(weight.grad().defined());
  weight_work.run();
  EXPECT_TRUE(bitwise_equal(x.grad(), x_reference.grad()));
  EXPECT_TRUE(bitwise_equal(weight.grad(), weight_reference.grad()));
}

TEST(DeferredWeightGradients, BackwardToInputsReturnsTheInputGradientWhileWeightWorkWaits) {
  // A pipeline stage: its input is a leaf, the previous stage waits for that input's gradient only.
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Mlp reference(dtype, Device::cpu()), deferred(dtype, Device::cpu());
    reference.loss().backward();
    DeferredWeightGradients weight_work;
    std::vector<Tensor> reached;
    {
      DeferWeightGradients defer(weight_work);
      reached = autograd::backward_to_inputs({deferred.loss()}, {Tensor()}, {deferred.x});
    }
    ASSERT_EQ(reached.size(), 1u);
    EXPECT_TRUE(bitwise_equal(reached[0], reference.x.grad()));
    EXPECT_FALSE(deferred.x.grad().defined()) << "the stop must not accumulate into the input's .grad";
    for (const auto& [name, parameter] : deferred.deferred_parameters()) {
      EXPECT_FALSE(parameter.grad().defined()) << name;
    }
    EXPECT_EQ(weight_work.size(), 3u);
    weight_work.run();
    for (const auto& [name, parameter] : deferred.parameters()) EXPECT_EQ(deferred.hook_calls[name], 1) << name;
    deferred.x.set_grad(reached[0]);  // so that expect_same_gradients compares it as well
    expect_same_gradients(deferred, reference);
  }
}

// --- The target and the queue -----------------------------------------------------------------

TEST(DeferredWeightGradients, GuardsNestAndRestoreThePreviousTarget) {
  Mlp model(kFloat64, Device::cpu());
  DeferredWeightGradients outer_work, inner_work;
  EXPECT_EQ(current_weight_gradient_deferral(), nullptr);
  {
    DeferWeightGradients outer(outer_work);
    EXPECT_EQ(current_weight_gradient_deferral(), &outer_work);
    {
      DeferWeightGradients inner(inner_work);
      EXPECT_EQ(current_weight_gradient_deferral(), &inner_work);
      // The target is per thread: another thread defers nothing.
      DeferredWeightGradients* seen_by_other_thread = &inner_work;
      std::thread([&] { seen_by_other_thread = current_weight_gradient_deferral(); }).join();
      EXPECT_EQ(seen_by_other_thread, nullptr);
      model.loss().backward();
    }
    EXPECT_EQ(current_weight_gradient_deferral(), &outer_work);
    model.loss().backward();
  }
  EXPECT_EQ(current_weight_gradient_deferral(), nullptr);
  EXPECT_EQ(inner_work.size(), 3u);
  EXPECT_EQ(outer_work.size(), 3u);
  EXPECT_FALSE(model.w1.grad().defined());
  EXPECT_FALSE(model.w3.grad().defined());

  // No guard: nothing is deferred, the weights are ready when backward returns.
  model.loss().backward();
  for (const auto& [name, parameter] : model.deferred_parameters()) EXPECT_EQ(model.hook_calls[name], 1) << name;
  EXPECT_EQ(inner_work.size(), 3u);
  EXPECT_EQ(outer_work.size(), 3u);

  // Three passes' worth of gradient in the end, whichever way each arrived.
  inner_work.run();
  outer_work.run();
  Mlp reference(kFloat64, Device::cpu());
  for (int pass = 0; pass < 3; ++pass) reference.loss().backward();
  for (const auto& [name, parameter] : model.parameters()) EXPECT_EQ(model.hook_calls[name], 3) << name;
  expect_same_gradients(model, reference);
}

TEST(DeferredWeightGradients, RunsItemsInOrderWithGradModeOffThenForgetsThem) {
  DeferredWeightGradients work;
  EXPECT_TRUE(work.empty());
  work.run();  // nothing to do
  std::vector<int> order;
  std::vector<bool> grad_mode;
  for (int item = 0; item < 3; ++item) {
    work.add([&, item] {
      order.push_back(item);
      grad_mode.push_back(autograd::grad_mode_enabled());
    });
  }
  EXPECT_EQ(work.size(), 3u);
  ASSERT_TRUE(autograd::grad_mode_enabled());
  work.run();
  EXPECT_TRUE(autograd::grad_mode_enabled()) << "run() restores grad mode";
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(grad_mode, (std::vector<bool>{false, false, false}));
  EXPECT_TRUE(work.empty());
  work.run();
  EXPECT_EQ(order.size(), 3u) << "a second run() runs nothing again";
}

TEST(DeferredWeightGradients, AnItemThatThrowsLeavesTheLaterOnesDeferred) {
  DeferredWeightGradients work;
  std::vector<int> order;
  work.add([&] { order.push_back(0); });
  work.add([] { WEFT_FAIL("injected failure"); });
  work.add([&] { order.push_back(2); });
  EXPECT_THROW(work.run(), Error);
  EXPECT_EQ(order, (std::vector<int>{0}));
  EXPECT_EQ(work.size(), 1u);
  work.run();
  EXPECT_EQ(order, (std::vector<int>{0, 2}));
}

// --- CUDA ------------------------------------------------------------------------------------

TEST(DeferredWeightGradientsCuda, MatchAnUndeferredBackwardBitForBitOnTheGpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device (or weft was built without CUDA)");
  const Device gpu = Device::cuda(0);
  Mlp reference(kFloat32, gpu), deferred(kFloat32, gpu);
  DeferredWeightGradients weight_work;
  expect_input_gradient_before_weights(reference, deferred, weight_work);
  weight_work.run();
  for (const auto& [name, parameter] : deferred.parameters()) EXPECT_EQ(deferred.hook_calls[name], 1) << name;
  expect_same_gradients(deferred, reference);
}

}  // namespace
}  // namespace weft
