// The autograd engine: fan-out and diamonds sum their gradients, .grad accumulates across passes,
// retain_graph, grad mode, grad-ready hooks (once per pass, last layer first, .grad final), custom
// ops written as autograd::Function, and the errors users hit.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

using testing::expect_gradients_match;
using testing::max_abs_difference;
using testing::random_leaf;

bool mentions(const std::string& message, const std::string& part) { return message.find(part) != std::string::npos; }

Tensor values(std::vector<double> data, std::vector<int64_t> shape) {
  return Tensor::from_vector(absl::Span<const double>(data), shape, kFloat64);
}

// --- Graph shapes ----------------------------------------------------------------------------

TEST(AutogradGraph, TensorUsedTwiceSumsBothPaths) {
  Tensor x = values({-1.5, 0.0, 2.0, 3.25}, {2, 2}).set_requires_grad(true);
  Tensor y = x * x + x;
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_NE(y.grad_fn(), nullptr);
  sum(y).backward();
  // d/dx (x^2 + x) = 2x + 1.
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{-2.0, 1.0, 5.0, 7.5}));
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * in[0] + in[0]; }, {random_leaf({3, 4}, 1)});
}

TEST(AutogradGraph, BackwardToInputsHandsBackTheInputGradientAndAccumulatesTheRest) {
  // A two-piece chain cut at h, as the step builder cuts a model into segments: the upper piece's
  // backward stops at its input leaf and returns its gradient; the lower piece starts from it.
  Tensor w = values({0.5, -2.0, 1.5, 3.0}, {2, 2}).set_requires_grad(true);
  Tensor v = values({1.0, 0.25, -1.0, 2.0}, {2, 2}).set_requires_grad(true);
  Tensor h = w * w;                                   // lower piece
  Tensor h_leaf = h.detach().set_requires_grad(true);
  Tensor y = sum(h_leaf * v + h_leaf);                // upper piece: h used twice
  std::vector<Tensor> reached = autograd::backward_to_inputs({y}, {Tensor()}, {h_leaf});
  ASSERT_EQ(reached.size(), 1u);
  EXPECT_FALSE(h_leaf.grad().defined()) << "the stop must not accumulate into the input's .grad";
  EXPECT_EQ(reached[0].to_vector(), (std::vector<double>{2.0, 1.25, 0.0, 3.0}));  // v + 1, both paths summed
  EXPECT_EQ(v.grad().to_vector(), h.to_vector());
  autograd::backward_to_inputs({h}, {reached[0]}, {});
  // The cut chain gives the whole chain's gradient: d/dw = 2 w (v + 1).
  Tensor w_reference = values({0.5, -2.0, 1.5, 3.0}, {2, 2}).set_requires_grad(true);
  sum((w_reference * w_reference) * v.detach() + w_reference * w_reference).backward();
  EXPECT_EQ(w.grad().to_vector(), w_reference.grad().to_vector());
  EXPECT_THROW(autograd::backward_to_inputs({sum(w * v)}, {Tensor()}, {h}), weft::Error);  // not a leaf
}

TEST(AutogradGraph, DiamondAddsBranchGradients) {
  // b = exp(a), c = a^2, d = b * c: dd/da = exp(a) a^2 + exp(a) 2a.
  Tensor a = values({-1.0, 0.5, 2.0}, {3}).set_requires_grad(true);
  Tensor d = mul(exp(a), square(a));
  sum(d).backward();
  const std::vector<double> grad = a.grad().to_vector();
  for (int i = 0; i < 3; ++i) {
    const double v = a.at({i});
    EXPECT_NEAR(grad[i], std::exp(v) * (v * v + 2 * v), 1e-12) << i;
  }
  // A wider diamond through views and a broadcast, checked numerically.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Tensor b = tanh(in[0]);
        Tensor c = sum(in[0].transpose(0, 1), {1}, true).transpose(0, 1);  // [1, 3]
        return mul(b, c) + b.narrow(1, 0, 1) * in[1];
      },
      {random_leaf({4, 3}, 2), random_leaf({4, 1}, 3)});
}

TEST(AutogradGraph, MultipleRootsShareOnePass) {
  Tensor x = values({1.0, -2.0}, {2}).set_requires_grad(true);
  Tensor first = sum(x * x);
  Tensor second = sum(x * 3.0);
  autograd::backward({first, second}, {Tensor(), Tensor()});
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5.0, -1.0}));  // 2x + 3
}

TEST(AutogradGraph, GradAccumulatesOverBackwardPasses) {
  Tensor x = values({1.0, 2.0, -3.0}, {3}).set_requires_grad(true);
  sum(x * x).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2.0, 4.0, -6.0}));
  sum(x * 5.0).backward();  // a new graph: its gradient adds onto .grad
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{7.0, 9.0, -1.0}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum(x * 5.0).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5.0, 5.0, 5.0}));
  // .grad does not alias the incoming gradient of the first pass: a later pass that shares the
  // upstream buffer must not change it behind the user's back.
  Tensor y = values({4.0}, {1}).set_requires_grad(true);
  Tensor ones = Tensor::ones({1}, kFloat64);
  y.backward(ones);
  y.backward(ones);
  EXPECT_EQ(y.grad().item(), 2.0);
  EXPECT_EQ(ones.item(), 1.0);
}

TEST(AutogradGraph, RetainGraphAllowsASecondBackward) {
  Tensor x = values({0.5, -1.0}, {2}).set_requires_grad(true);
  Tensor loss = sum(x * x + x);
  loss.backward();
  const std::string message = error_message([&] { loss.backward(); });
  EXPECT_TRUE(mentions(message, "retain_graph")) << message;
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2.0, -1.0}));  // the failed pass added nothing

  x.zero_grad();
  Tensor retained = sum(x * x + x);
  retained.backward(Tensor(), /*retain_graph=*/true);
  retained.backward(Tensor(), /*retain_graph=*/true);
  retained.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{6.0, -3.0}));
  EXPECT_THROW(retained.backward(), Error);
}

// --- Grad mode -------------------------------------------------------------------------------

TEST(AutogradGradMode, NoGradGuardRecordsNothingAndRestores) {
  Tensor x = values({1.0, 2.0}, {2}).set_requires_grad(true);
  ASSERT_TRUE(autograd::grad_mode_enabled());
  {
    autograd::NoGradGuard no_grad;
    EXPECT_FALSE(autograd::grad_mode_enabled());
    Tensor y = x * x + x;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_TRUE(y.is_leaf());
    Tensor view = x.transpose(0, 0).view({2, 1});
    EXPECT_FALSE(view.requires_grad());
    EXPECT_FALSE(sum(x).requires_grad());
    EXPECT_TRUE(x.requires_grad());  // the leaf itself keeps its flag
    {
      autograd::NoGradGuard nested;
      EXPECT_FALSE(autograd::grad_mode_enabled());
    }
    EXPECT_FALSE(autograd::grad_mode_enabled());  // the inner guard restores "off", not "on"
  }
  EXPECT_TRUE(autograd::grad_mode_enabled());
  EXPECT_TRUE((x * x).requires_grad());
  // Restored on unwinding too.
  try {
    autograd::NoGradGuard no_grad;
    throw Error("leaving the scope");
  } catch (const Error&) {
  }
  EXPECT_TRUE(autograd::grad_mode_enabled());
  // An explicit switch is visible to ops.
  autograd::set_grad_mode_enabled(false);
  EXPECT_FALSE((x * x).requires_grad());
  autograd::set_grad_mode_enabled(true);
  EXPECT_TRUE((x * x).requires_grad());
}

// --- Grad-ready hooks ------------------------------------------------------------------------

struct HookRecord {
  std::string name;
  Tensor grad;  // a copy of .grad taken inside the hook
};

// x [2, 3] -> tanh(x w1) [2, 4] -> tanh(. w2) [2, 4] -> . w3 [2, 2]: a three-layer MLP.
struct ThreeLayerChain {
  Tensor x = random_leaf({2, 3}, 10, /*requires_grad=*/false);
  Tensor w1 = random_leaf({3, 4}, 11);
  Tensor w2 = random_leaf({4, 4}, 12);
  Tensor w3 = random_leaf({4, 2}, 13);
  std::vector<HookRecord> records;

  ThreeLayerChain() {
    for (auto [tensor, name] : {std::pair{&w1, "w1"}, std::pair{&w2, "w2"}, std::pair{&w3, "w3"}}) {
      tensor->register_grad_ready_hook([this, name = std::string(name)](Tensor& leaf) {
        records.push_back({name, leaf.grad().clone()});
      });
    }
  }
  Tensor loss(const Tensor& first_weight) const {
    Tensor h1 = tanh(matmul(x, first_weight));
    Tensor h2 = tanh(matmul(h1, w2));
    return sum(square(matmul(h2, w3)));
  }
};

TEST(AutogradHooks, FireOncePerBackwardLastLayerFirstWithFinalGrad) {
  ThreeLayerChain chain;
  for (int step = 0; step < 3; ++step) {
    chain.records.clear();
    chain.loss(chain.w1).backward();
    ASSERT_EQ(chain.records.size(), 3u) << "step " << step;
    EXPECT_EQ(chain.records[0].name, "w3") << "step " << step;
    EXPECT_EQ(chain.records[1].name, "w2") << "step " << step;
    EXPECT_EQ(chain.records[2].name, "w1") << "step " << step;
    // Inside the hook .grad already holds everything this pass contributes (it accumulates over
    // steps, so it equals step + 1 times the one-step gradient).
    for (const HookRecord& record : chain.records) {
      const Tensor& parameter = record.name == "w1" ? chain.w1 : record.name == "w2" ? chain.w2 : chain.w3;
      EXPECT_EQ(max_abs_difference(record.grad, parameter.grad()), 0.0) << record.name << " step " << step;
    }
  }
  // Compare against one fresh pass: three accumulated passes are three times one pass.
  Tensor w1_grad = chain.w1.grad().clone();
  chain.w1.zero_grad();
  chain.records.clear();
  chain.loss(chain.w1).backward();
  EXPECT_LT(max_abs_difference(w1_grad, chain.w1.grad() * 3.0), 1e-10);
}

TEST(AutogradHooks, TiedWeightFiresOnceWithTheSumOfBothUses) {
  Tensor x = random_leaf({2, 3}, 20, false);
  Tensor w = random_leaf({3, 3}, 21);
  int calls = 0;
  Tensor seen;
  w.register_grad_ready_hook([&](Tensor& leaf) {
    ++calls;
    seen = leaf.grad().clone();
  });
  Tensor loss = sum(matmul(tanh(matmul(x, w)), w));
  loss.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(max_abs_difference(seen, w.grad()), 0.0);
  // And that sum is the right gradient.
  expect_gradients_match([&](const std::vector<Tensor>& in) { return matmul(tanh(matmul(x, in[0])), in[0]); },
                         {random_leaf({3, 3}, 21)});
}

TEST(AutogradHooks, LinearAddsItsWeightGradientInPlaceAndTheHookFiresOnceWithEveryUse) {
  // A weight whose .grad exists (the gradient buffer's slot) gets linear's dW added by the GEMM
  // itself; a second, tied use of the weight still lands in the same .grad, and the hook fires once,
  // after both.
  Tensor x = random_leaf({4, 3}, 30, false);
  Tensor bias = random_leaf({5}, 32);
  const Tensor earlier = Tensor::normal({5, 3}, 33).to(kFloat64);
  const auto loss_of = [&](const Tensor& w) { return sum(matmul(tanh(linear(x, w, bias)), w)); };

  Tensor fresh = random_leaf({5, 3}, 31);
  loss_of(fresh).backward();  // no .grad yet: dW is returned and accumulated as usual
  const Tensor expected = fresh.grad() + earlier;

  Tensor w = random_leaf({5, 3}, 31);
  w.set_grad(earlier.clone());
  const void* storage = w.grad().raw_data();
  int calls = 0;
  Tensor seen;
  w.register_grad_ready_hook([&](Tensor& leaf) {
    ++calls;
    seen = leaf.grad().clone();
  });
  loss_of(w).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(w.grad().raw_data(), storage) << "the gradient was not added in place";
  EXPECT_EQ(max_abs_difference(seen, w.grad()), 0.0) << "the hook ran before every use was in";
  EXPECT_LT(max_abs_difference(w.grad(), expected), 1e-12);
}

TEST(AutogradHooks, AGradThatCountsAsZeroIsOverwrittenInPlaceAndNeverRead) {
  // mark_grad_zero keeps .grad's storage and writes nothing: linear's GEMM, a norm's kernel and
  // AccumulateGrad's copy write into it (NaN there would survive an add), a norm whose weight counts
  // as zero and whose bias does not adds into both, and a leaf that gets no gradient reads zeros.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = random_leaf({6, 4}, 40, false);
  const auto loss_of = [&](const Tensor& w, const Tensor& b, const Tensor& gamma, const Tensor& beta,
                           const Tensor& scale) {
    return sum(tanh(layer_norm(linear(x, w, b), gamma, beta)) * scale);
  };
  const auto leaves = [] {
    return std::vector<Tensor>{random_leaf({5, 4}, 41), random_leaf({5}, 42), random_leaf({5}, 43),
                               random_leaf({5}, 44), random_leaf({6, 5}, 45)};
  };
  std::vector<Tensor> fresh = leaves();
  loss_of(fresh[0], fresh[1], fresh[2], fresh[3], fresh[4]).backward();

  std::vector<Tensor> lazy = leaves();
  std::vector<const void*> storage;
  for (Tensor& leaf : lazy) {
    leaf.set_grad(Tensor::full(leaf.shape(), nan, kFloat64));
    storage.push_back(leaf.grad().raw_data());
    leaf.mark_grad_zero();
  }
  loss_of(lazy[0], lazy[1], lazy[2], lazy[3], lazy[4]).backward();
  for (size_t i = 0; i < lazy.size(); ++i) {
    EXPECT_EQ(lazy[i].grad().raw_data(), storage[i]) << "leaf " << i << " lost its storage";
    EXPECT_EQ(max_abs_difference(lazy[i].grad(), fresh[i].grad()), 0.0) << "leaf " << i;
  }
  // The norm's weight counts as zero, its bias holds a gradient: both end as sums.
  lazy[2].grad().fill_(nan);
  lazy[2].mark_grad_zero();
  loss_of(lazy[0], lazy[1], lazy[2], lazy[3], lazy[4]).backward();
  EXPECT_EQ(max_abs_difference(lazy[2].grad(), fresh[2].grad()), 0.0);
  EXPECT_EQ(max_abs_difference(lazy[3].grad(), fresh[3].grad() + fresh[3].grad()), 0.0);
  // No gradient arrives: grad() writes the zeros.
  Tensor unused = random_leaf({3}, 46);
  unused.set_grad(Tensor::full({3}, nan, kFloat64));
  unused.mark_grad_zero();
  EXPECT_EQ(unused.grad().to_vector(), std::vector<double>(3, 0.0));
}

TEST(AutogradHooks, EmbeddingScattersIntoTheGradItselfTiedOrNot) {
  // embedding's backward adds its rows into the weight's .grad in place when the leaf offers it:
  // untied with .grad counting as zero (NaN there: the rows it names are added onto the zeros
  // written first, the others stay zero), and tied to an output head that wrote its dW there first.
  // Against the gradients of leaves without a .grad (a new tensor scattered into, then added), and
  // the scatter-add against finite differences. (The values cannot tell the in-place path from a
  // returned gradient that AccumulateGrad copies; the NaN can tell whether its zeros were written.)
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 0, 3, 5, 3, 0}, {2, 3}, kInt64);
  const Tensor hidden = random_leaf({2, 3, 4}, 61, false);
  const auto untied = [&](const Tensor& w) { return sum(tanh(embedding(ids, w)) * hidden); };
  const auto tied = [&](const Tensor& w) { return sum(tanh(linear(tanh(embedding(ids, w)), w))); };
  expect_gradients_match([&](const std::vector<Tensor>& in) { return tied(in[0]); }, {random_leaf({7, 4}, 60)});
  using LossOf = std::function<Tensor(const Tensor&)>;
  for (const LossOf& loss_of : {LossOf(untied), LossOf(tied)}) {
    Tensor fresh = random_leaf({7, 4}, 60);
    loss_of(fresh).backward();
    Tensor lazy = random_leaf({7, 4}, 60);
    lazy.set_grad(Tensor::full({7, 4}, nan, kFloat64));
    const void* storage = lazy.grad().raw_data();
    lazy.mark_grad_zero();
    loss_of(lazy).backward();
    EXPECT_EQ(lazy.grad().raw_data(), storage) << "the gradient lost its storage";
    EXPECT_LT(max_abs_difference(lazy.grad(), fresh.grad()), 1e-12);
    // A .grad that holds a gradient: the next backward adds onto it.
    loss_of(lazy).backward();
    EXPECT_EQ(lazy.grad().raw_data(), storage);
    EXPECT_LT(max_abs_difference(lazy.grad(), fresh.grad() * 2.0), 1e-12);
  }
}

TEST(AutogradFunction, LinearsReadingOneInputSumItsGradientInTheLastGemm) {
  // Two linears (no bias, as Llama's gate and up) and a third use read x: the second linear's
  // backward takes the gradient x already has and adds it in its dX product. Against finite
  // differences, and bit for bit against the same sum made by the engine's add (the CPU reference
  // computes the product and the add as the engine does).
  const auto function = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    return tanh(linear(x, in[1])) * tanh(linear(x, in[2])) + sum(x * x, {-1}, true);
  };
  expect_gradients_match(function, {random_leaf({2, 3, 4}, 50), random_leaf({5, 4}, 51), random_leaf({5, 4}, 52)});
  Tensor x = random_leaf({6, 4}, 53);
  Tensor w1 = random_leaf({5, 4}, 54), w2 = random_leaf({5, 4}, 55);
  sum(function({x, w1, w2})).backward();
  // The same sum with each product's gradient made separately (matmul's backward takes nothing).
  Tensor x_separate = x.detach().set_requires_grad(true);
  sum(tanh(matmul(x_separate, w1.detach().transpose(0, 1))) * tanh(matmul(x_separate, w2.detach().transpose(0, 1))) +
      sum(x_separate * x_separate, {-1}, true))
      .backward();
  EXPECT_EQ(max_abs_difference(x.grad(), x_separate.grad()), 0.0);
}

TEST(AutogradHooks, OnlyLeavesThatRequireGradTakeHooks) {
  Tensor plain = Tensor::ones({2});
  EXPECT_THROW(plain.register_grad_ready_hook([](Tensor&) {}), Error);
  Tensor parameter = Tensor::ones({2}, kFloat64).set_requires_grad(true);
  Tensor result = parameter * 2.0;
  const std::string message = error_message([&] { result.register_grad_ready_hook([](Tensor&) {}); });
  EXPECT_TRUE(mentions(message, "register_grad_ready_hook")) << message;
}

// Identity on its input that logs when its backward runs.
class MarkerFunction : public autograd::Function {
 public:
  MarkerFunction(std::vector<std::string>* events, std::string label) : events_(events), label_(std::move(label)) {}
  std::string name() const override { return "MarkerBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {inputs[0]}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    events_->push_back(label_);
    return {grads[0]};
  }

 private:
  std::vector<std::string>* events_;
  std::string label_;
};

// node.h: backward runs later nodes first "so gradients of the last layers become ready first (what
// data-parallel bucketing wants)": w3's hook must fire before the first layer's backward runs, so
// that its all-reduce overlaps with the rest of the backward. That has to hold on every training
// step, not only the first one.
TEST(AutogradHooks, LastLayerGradIsReadyBeforeFirstLayerBackwardOnEveryStep) {
  ThreeLayerChain chain;
  std::vector<std::string> events;
  for (auto [tensor, name] : {std::pair{&chain.w1, "w1"}, std::pair{&chain.w2, "w2"}, std::pair{&chain.w3, "w3"}}) {
    tensor->register_grad_ready_hook([&events, name = std::string(name)](Tensor&) { events.push_back(name); });
  }
  for (int step = 0; step < 3; ++step) {
    events.clear();
    Tensor marked_w1 = autograd::apply<MarkerFunction>({chain.w1}, &events, "layer1 backward")[0];
    chain.loss(marked_w1).backward();
    EXPECT_EQ(events, (std::vector<std::string>{"w3", "w2", "layer1 backward", "w1"})) << "step " << step;
    chain.w1.zero_grad();
    chain.w2.zero_grad();
    chain.w3.zero_grad();
  }
}

// --- Custom ops ------------------------------------------------------------------------------

// y = factor * x^2 + shift, with its state as members and x saved for the backward.
class ScaledSquareFunction : public autograd::Function {
 public:
  ScaledSquareFunction(double factor, double shift) : factor_(factor), shift_(shift) {}
  std::string name() const override { return "ScaledSquareBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    EXPECT_FALSE(autograd::grad_mode_enabled()) << "forward runs with grad mode off";
    save_for_backward({inputs[0]});
    return {add_scalar(scale(square(inputs[0]), factor_), shift_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    EXPECT_FALSE(autograd::grad_mode_enabled()) << "backward runs with grad mode off";
    const Tensor& x = saved()[0];
    EXPECT_FALSE(x.requires_grad()) << "saved tensors are detached";
    return {mul(grads[0], scale(x, 2.0 * factor_))};
  }

 private:
  double factor_, shift_;
};

TEST(AutogradFunction, CustomOpWithStateAndSavedTensors) {
  Tensor x = random_leaf({3, 4}, 30);
  Tensor y = autograd::apply<ScaledSquareFunction>({x}, 1.5, -2.0)[0];
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "ScaledSquareBackward");
  EXPECT_EQ(y.at({1, 2}), 1.5 * x.at({1, 2}) * x.at({1, 2}) - 2.0);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return autograd::apply<ScaledSquareFunction>({in[0]}, 1.5, -2.0)[0]; },
      {random_leaf({3, 4}, 30)});
  // Composed with built-in ops, on a non-contiguous view of the input.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Tensor t = autograd::apply<ScaledSquareFunction>({in[0].transpose(0, 1)}, -0.5, 1.0)[0];
        return matmul(t, in[1]);
      },
      {random_leaf({3, 4}, 31), random_leaf({3, 2}, 32)});
  // Without an input that requires grad nothing is recorded.
  Tensor constant = random_leaf({2}, 33, false);
  EXPECT_FALSE(autograd::apply<ScaledSquareFunction>({constant}, 1.0, 0.0)[0].requires_grad());
}

// (x, y) -> (x * y, x - y). Records whether the gradient of each output arrived.
class ProductAndDifferenceFunction : public autograd::Function {
 public:
  explicit ProductAndDifferenceFunction(std::vector<bool>* arrived) : arrived_(arrived) {}
  std::string name() const override { return "ProductAndDifferenceBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    save_for_backward({inputs[0], inputs[1]});
    return {mul(inputs[0], inputs[1]), sub(inputs[0], inputs[1])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    EXPECT_EQ(grads.size(), 2u);
    if (arrived_ != nullptr) *arrived_ = {grads[0].defined(), grads[1].defined()};
    const Tensor product_grad = grad_or_zeros(grads, 0);
    const Tensor difference_grad = grad_or_zeros(grads, 1);
    EXPECT_EQ(difference_grad.shape(), saved()[0].shape());
    return {add(mul(product_grad, saved()[1]), difference_grad),
            sub(mul(product_grad, saved()[0]), difference_grad)};
  }

 private:
  std::vector<bool>* arrived_;
};

// y = 2x whose backward takes the gradient already pending for x (autograd::take_pending_gradient)
// and returns it added to its own, recording what it took.
class TakingDoubleFunction : public autograd::Function {
 public:
  TakingDoubleFunction(DType take_dtype, Tensor* taken) : take_dtype_(take_dtype), taken_(taken) {}
  std::string name() const override { return "TakingDoubleBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {scale(inputs[0], 2.0)}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor own = scale(grads[0], 2.0);
    *taken_ = autograd::take_pending_gradient(next_edges[0], take_dtype_, own.numel(), own.device());
    return {taken_->defined() ? add(own, *taken_) : own};
  }

 private:
  DType take_dtype_;
  Tensor* taken_;
};

TEST(AutogradFunction, TakePendingGradientHandsOverWhatArrivedEarlierOnce) {
  for (const bool leaf_input : {true, false}) {
    SCOPED_TRACE(leaf_input ? "x a leaf" : "x from an op");
    const Tensor x = random_leaf({2, 3}, 60);
    const Tensor input = leaf_input ? x : tanh(x);
    Tensor taken;
    const Tensor doubled = autograd::apply<TakingDoubleFunction>({input}, kFloat64, &taken)[0];
    const Tensor tripled = scale(input, 3.0);  // created later: its backward runs first
    sum(add(doubled, tripled)).backward();
    ASSERT_TRUE(taken.defined()) << "the gradient from the tripling arrived before the doubling's backward";
    EXPECT_LE(max_abs_difference(taken, Tensor::full({2, 3}, 3.0, kFloat64)), 0.0);
    // d/dx of 5 * input: summed once (taken and returned), not twice.
    const Tensor expected = leaf_input ? Tensor::full({2, 3}, 5.0, kFloat64)
                                       : scale(sub(Tensor::ones({2, 3}, kFloat64), square(tanh(x.detach()))), 5.0);
    EXPECT_LE(max_abs_difference(x.grad(), expected), 1e-12);
  }
  // Nothing is taken where the dtype differs (the engine sums it as usual), nor outside a backward.
  const Tensor x = random_leaf({2, 3}, 61);
  Tensor taken;
  const Tensor doubled = autograd::apply<TakingDoubleFunction>({x}, kFloat32, &taken)[0];
  sum(add(doubled, scale(x, 3.0))).backward();
  EXPECT_FALSE(taken.defined());
  EXPECT_LE(max_abs_difference(x.grad(), Tensor::full({2, 3}, 5.0, kFloat64)), 0.0);
  EXPECT_FALSE(autograd::take_pending_gradient(autograd::gradient_edge(x), kFloat64, 6, Device::cpu()).defined());
}

// y = 2x whose backward records whether its gradient for x is all that x's producer receives
// (autograd::receives_only_this_gradient), asked after taking the pending gradient when `take`.
class AskingDoubleFunction : public autograd::Function {
 public:
  AskingDoubleFunction(bool take, bool* answer) : take_(take), answer_(answer) {}
  std::string name() const override { return "AskingDoubleBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {scale(inputs[0], 2.0)}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor own = scale(grads[0], 2.0);
    const Tensor taken =
        take_ ? autograd::take_pending_gradient(next_edges[0], own.dtype(), own.numel(), own.device()) : Tensor();
    *answer_ = autograd::receives_only_this_gradient(next_edges[0]);
    return {taken.defined() ? add(own, taken) : own};
  }

 private:
  bool take_;
  bool* answer_;
};

TEST(AutogradFunction, ReceivesOnlyThisGradientWhenNoOtherGradientIsOnItsWay) {
  // x's producer is tanh; a second use of its output, when there is one, is created before or after
  // the asking op: before, its backward runs later (another gradient still to come); after, it has
  // deposited its gradient already, which counts only once taken.
  struct Case {
    const char* name;
    int second_use;  // 0 none, -1 created before the asking op, +1 created after it
    bool take;
    bool expected;
  };
  for (const Case& c : {Case{"one use", 0, false, true}, Case{"a use whose backward runs later", -1, true, false},
                        Case{"an earlier gradient left in the slot", 1, false, false},
                        Case{"an earlier gradient taken", 1, true, true}}) {
    SCOPED_TRACE(c.name);
    const Tensor x = random_leaf({2, 3}, 62);
    const Tensor stream = tanh(x);
    Tensor loss;
    if (c.second_use < 0) loss = sum(scale(stream, 3.0));
    bool answer = !c.expected;
    const Tensor doubled = autograd::apply<AskingDoubleFunction>({stream}, c.take, &answer)[0];
    loss = loss.defined() ? add(loss, sum(doubled)) : sum(doubled);
    if (c.second_use > 0) loss = add(loss, sum(scale(stream, 3.0)));
    loss.backward();
    EXPECT_EQ(answer, c.expected);
    const double factor = c.second_use != 0 ? 5.0 : 2.0;
    EXPECT_LE(max_abs_difference(x.grad(), scale(sub(Tensor::ones({2, 3}, kFloat64), square(tanh(x.detach()))), factor)),
              1e-12);
  }
  EXPECT_FALSE(autograd::receives_only_this_gradient(autograd::gradient_edge(tanh(random_leaf({2}, 63)))));
}

// a + b whose backward records, per input, whether its gradient is all that input's producer
// receives.
class AskingAddFunction : public autograd::Function {
 public:
  explicit AskingAddFunction(std::vector<bool>* answers) : answers_(answers) {}
  std::string name() const override { return "AskingAddBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {add(inputs[0], inputs[1])}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    for (const autograd::Edge& edge : next_edges) answers_->push_back(autograd::receives_only_this_gradient(edge));
    return {grads[0], grads[0]};
  }

 private:
  std::vector<bool>* answers_;
};

TEST(AutogradFunction, ReceivesOnlyThisGradientNotWhenTheRunningNodeHasTwoEdgesIntoTheProducer) {
  // tanh(x) + tanh(x) of one tanh: the tanh receives two gradients (both from the add), so neither
  // describes all it receives; of two tanhs, each receives one.
  for (const bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "one producer for both inputs" : "a producer each");
    const Tensor x = random_leaf({2, 3}, 64);
    const Tensor a = tanh(x);
    const Tensor b = shared ? a : tanh(x);
    std::vector<bool> answers;
    sum(autograd::apply<AskingAddFunction>({a, b}, &answers)[0]).backward();
    EXPECT_EQ(answers, std::vector<bool>(2, !shared));
    EXPECT_LE(max_abs_difference(x.grad(), scale(sub(Tensor::ones({2, 3}, kFloat64), square(tanh(x.detach()))), 2.0)),
              1e-12);
  }
}

// y = 2x whose backward records where the gradient it returns for x ends up
// (autograd::gradient_destination).
class DestinationAskingDoubleFunction : public autograd::Function {
 public:
  explicit DestinationAskingDoubleFunction(autograd::Edge* destination) : destination_(destination) {}
  std::string name() const override { return "DestinationAskingDoubleBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {scale(inputs[0], 2.0)}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    *destination_ = autograd::gradient_destination(next_edges[0]);
    return {scale(grads[0], 2.0)};
  }

 private:
  autograd::Edge* destination_;
};

TEST(AutogradGraph, GradientDestinationSeesThroughAStopToItsProducer) {
  // The step builder's cut: h = tanh(w) below, its detached leaf above. Given h as the leaf's
  // producer, the upper piece's ops see h's node behind the leaf; without, the leaf's own.
  for (const bool with_producer : {true, false}) {
    SCOPED_TRACE(with_producer ? "with a producer" : "without");
    const Tensor w = random_leaf({2, 3}, 65);
    const Tensor h = tanh(w);
    const Tensor h_leaf = h.detach().set_requires_grad(true);
    autograd::Edge destination;
    const Tensor y = sum(autograd::apply<DestinationAskingDoubleFunction>({h_leaf}, &destination)[0]);
    const std::vector<Tensor> reached = autograd::backward_to_inputs(
        {y}, {Tensor()}, {h_leaf}, with_producer ? std::vector<Tensor>{h} : std::vector<Tensor>{});
    EXPECT_EQ(destination.node, with_producer ? autograd::gradient_edge(h).node : autograd::gradient_edge(h_leaf).node);
    EXPECT_EQ(reached[0].to_vector(), std::vector<double>(6, 2.0));
  }
  // Outside a walk an edge is its own destination; a producer list must match the inputs.
  const Tensor t = tanh(random_leaf({2}, 66));
  EXPECT_EQ(autograd::gradient_destination(autograd::gradient_edge(t)).node, autograd::gradient_edge(t).node);
  const Tensor leaf = random_leaf({2}, 67);
  expect_contains(error_message([&] { autograd::backward_to_inputs({sum(leaf)}, {Tensor()}, {leaf}, {t, t}); }),
                  {"2 producers for 1 inputs"});
}

TEST(AutogradFunction, TwoOutputsWithOnlyOneUsed) {
  std::vector<bool> arrived;
  Tensor x = random_leaf({2, 3}, 40), y = random_leaf({2, 3}, 41);
  std::vector<Tensor> outputs = autograd::apply<ProductAndDifferenceFunction>({x, y}, &arrived);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].grad_fn(), outputs[1].grad_fn());
  sum(outputs[0]).backward();
  EXPECT_EQ(arrived, (std::vector<bool>{true, false}));  // the unused output's grad is undefined
  EXPECT_EQ(max_abs_difference(x.grad(), y), 0.0);
  EXPECT_EQ(max_abs_difference(y.grad(), x), 0.0);

  sum(apply_function(std::make_shared<ProductAndDifferenceFunction>(&arrived), {x, y})[1]).backward();
  EXPECT_EQ(arrived, (std::vector<bool>{false, true}));

  for (int used : {0, 1}) {
    expect_gradients_match(
        [used](const std::vector<Tensor>& in) {
          return autograd::apply<ProductAndDifferenceFunction>({in[0], in[1]}, nullptr)[used];
        },
        {random_leaf({2, 3}, 42), random_leaf({2, 3}, 43)});
  }
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> both = autograd::apply<ProductAndDifferenceFunction>({in[0], in[1]}, nullptr);
        return mul(both[0], both[1]);
      },
      {random_leaf({2, 3}, 44), random_leaf({2, 3}, 45)});
}

// (x f64, ids i64) -> (x scaled per row by ids, argmax-like i64 copy of ids).
class RowScaleFunction : public autograd::Function {
 public:
  std::string name() const override { return "RowScaleBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    factors_ = inputs[1].to(inputs[0].dtype()).unsqueeze(1);
    return {mul(inputs[0], factors_), inputs[1].clone()};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    EXPECT_FALSE(grads[1].defined()) << "an integer output never receives a gradient";
    return {mul(grads[0], factors_), Tensor()};  // no gradient for the integer ids
  }

 private:
  Tensor factors_;  // [rows, 1]
};

TEST(AutogradFunction, IntegerOutputsCarryNoHistory) {
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{2, -1, 3}, {3});
  Tensor x = random_leaf({3, 2}, 50);
  std::vector<Tensor> outputs = autograd::apply<RowScaleFunction>({x, ids});
  EXPECT_TRUE(outputs[0].requires_grad());
  EXPECT_FALSE(outputs[1].requires_grad());
  EXPECT_EQ(outputs[1].grad_fn(), nullptr);
  EXPECT_EQ(outputs[1].dtype(), kInt64);
  sum(outputs[0]).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{2, 2, -1, -1, 3, 3}));
  expect_gradients_match([&](const std::vector<Tensor>& in) { return autograd::apply<RowScaleFunction>({in[0], ids})[0]; },
                         {random_leaf({3, 2}, 51)});

  // Built-in ops follow the same rule.
  Tensor y = random_leaf({3, 4}, 52);
  auto [maximum, indices] = max(y, 1);
  EXPECT_TRUE(maximum.requires_grad());
  EXPECT_FALSE(indices.requires_grad());
  EXPECT_EQ(indices.grad_fn(), nullptr);
  Tensor truncated = y.to(kInt32);
  EXPECT_FALSE(truncated.requires_grad());
  EXPECT_EQ(truncated.grad_fn(), nullptr);
}

// Returns one gradient too few, or one of the wrong shape.
class BrokenFunction : public autograd::Function {
 public:
  explicit BrokenFunction(bool wrong_count) : wrong_count_(wrong_count) {}
  std::string name() const override { return "BrokenBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {add(inputs[0], inputs[1])}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    if (wrong_count_) return {grads[0]};
    return {grads[0], sum(grads[0], {0})};
  }

 private:
  bool wrong_count_;
};

TEST(AutogradFunction, BackwardReturningTooFewGradientsIsReported) {
  Tensor a = random_leaf({2, 3}, 60), b = random_leaf({2, 3}, 61);
  const std::string message =
      error_message([&] { sum(autograd::apply<BrokenFunction>({a, b}, true)[0]).backward(); });
  EXPECT_TRUE(mentions(message, "BrokenBackward")) << message;
}

TEST(AutogradFunction, WrongShapeGradientForAnIntermediateIsReported) {
  Tensor a = random_leaf({2, 3}, 62), b = random_leaf({2, 3}, 63);
  Tensor intermediate = b * 2.0;
  const std::string message =
      error_message([&] { sum(autograd::apply<BrokenFunction>({a, intermediate}, false)[0]).backward(); });
  EXPECT_TRUE(mentions(message, "BrokenBackward") && mentions(message, "[3]") && mentions(message, "[2, 3]"))
      << message;
}

// The same mistake with a leaf input must not slip through: a [3] gradient for a [2, 3] parameter
// would otherwise be broadcast into .grad, giving every row the same wrong gradient.
TEST(AutogradFunction, WrongShapeGradientForALeafIsReported) {
  Tensor a = random_leaf({2, 3}, 64), b = random_leaf({2, 3}, 65);
  const std::string message =
      error_message([&] { sum(autograd::apply<BrokenFunction>({a, b}, false)[0]).backward(); });
  EXPECT_TRUE(mentions(message, "BrokenBackward") && mentions(message, "[3]") && mentions(message, "[2, 3]"))
      << message;
  EXPECT_FALSE(b.grad().defined()) << "a wrong-shaped gradient was accumulated: " << b.grad();
}

// --- Errors ----------------------------------------------------------------------------------

TEST(AutogradErrors, SetRequiresGradOnANonLeafThrows) {
  Tensor x = Tensor::ones({2}, kFloat64).set_requires_grad(true);
  Tensor y = x * 2.0;
  const std::string message = error_message([&] { y.set_requires_grad(true); });
  EXPECT_TRUE(mentions(message, "set_requires_grad") && mentions(message, "detach")) << message;
  // Detaching gives a leaf that may require grad on its own.
  Tensor z = y.detach();
  z.set_requires_grad(true);
  EXPECT_TRUE(z.is_leaf());
  // Only floating tensors can require grad.
  Tensor ids = Tensor::arange(3);
  const std::string int_message = error_message([&] { ids.set_requires_grad(true); });
  EXPECT_TRUE(mentions(int_message, "i64")) << int_message;
}

TEST(AutogradErrors, NonScalarBackwardNeedsAGradient) {
  Tensor x = values({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  Tensor y = x * 3.0;
  const std::string message = error_message([&] { y.backward(); });
  EXPECT_TRUE(mentions(message, "gradient") && mentions(message, "[2, 2]")) << message;
  const std::string shape_message = error_message([&] { y.backward(Tensor::ones({4}, kFloat64)); });
  EXPECT_TRUE(mentions(shape_message, "[4]") && mentions(shape_message, "[2, 2]")) << shape_message;
  EXPECT_FALSE(x.grad().defined());
  y.backward(values({1, -1, 0.5, 2}, {2, 2}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, -3, 1.5, 6}));
  // A one-element non-scalar tensor needs no explicit gradient.
  Tensor single = values({2}, {1, 1}).set_requires_grad(true);
  (single * single).backward();
  EXPECT_EQ(single.grad().item(), 4.0);
}

TEST(AutogradErrors, BackwardWithoutGradThrowsAHelpfulMessage) {
  Tensor x = values({1, 2}, {2});
  const std::string message = error_message([&] { sum(x * x).backward(); });
  EXPECT_TRUE(mentions(message, "does not require grad")) << message;
  EXPECT_TRUE(mentions(message, "set_requires_grad") || mentions(message, "NoGradGuard")) << message;
  // Computed under NoGradGuard from a tensor that does require grad: same error.
  Tensor parameter = values({1, 2}, {2}).set_requires_grad(true);
  Tensor loss;
  {
    autograd::NoGradGuard no_grad;
    loss = sum(parameter * parameter);
  }
  EXPECT_TRUE(mentions(error_message([&] { loss.backward(); }), "does not require grad"));
  EXPECT_FALSE(parameter.grad().defined());
}

}  // namespace
}  // namespace weft
