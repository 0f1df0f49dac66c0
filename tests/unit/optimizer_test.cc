// Optimizers, learning-rate schedules, gradient clipping and accumulation (optim/).
//
// Single steps are checked against values computed by hand from the formulas in optim/sgd.h and
// optim/adamw.h, in f64 so that only rounding separates them. Agreement with PyTorch itself over
// several steps is the golden test's job (tests/golden/optimizer_golden.*).
#include <bit>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "optim/adamw.h"
#include "optim/gradient_accumulation.h"
#include "optim/gradient_clipping.h"
#include "optim/lr_schedule.h"
#include "optim/master_weights.h"
#include "optim/optimizer.h"
#include "runtime/split_master_weights.h"
#include "runtime/weft.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

NamedParameter make_parameter(const std::string& name, std::vector<double> values, std::vector<int64_t> shape,
                              DType dtype = kFloat64) {
  Tensor tensor = Tensor::from_vector(values, shape, dtype);
  tensor.set_requires_grad(true);
  return NamedParameter{.name = name, .tensor = tensor, .layout = Layout::replicate()};
}

void set_gradient(const NamedParameter& parameter, std::vector<double> values, DType dtype = kFloat64) {
  Tensor tensor = parameter.tensor;
  tensor.set_grad(Tensor::from_vector(values, parameter.tensor.shape(), dtype));
}

std::vector<ParameterGroup> one_group(std::vector<NamedParameter> parameters, double weight_decay = 0.0) {
  return {ParameterGroup{.parameters = std::move(parameters), .weight_decay = weight_decay}};
}

// Gradient of step `step` for parameter number `index`: fixed pseudo-random values.
Tensor synthetic_gradient(const Tensor& parameter, int step, int index) {
  return Tensor::normal(parameter.shape(), /*seed=*/77, /*offset=*/static_cast<uint64_t>(1000 * step + 100 * index),
                        0.0, 1.0, kFloat32);
}

template <class Function>
void expect_error(Function&& function, const std::string& fragment) {
  const std::string message = error_message(function);
  EXPECT_NE(message.find(fragment), std::string::npos)
      << "expected an error containing \"" << fragment << "\", got: " << message;
}

// --- Groups and zero_grad -------------------------------------------------------------------

TEST(ParameterGroups, MatricesAreDecayedVectorsAreNot) {
  std::vector<NamedParameter> parameters = {
      make_parameter("linear.weight", {1, 2, 3, 4}, {2, 2}), make_parameter("linear.bias", {1, 2}, {2}),
      make_parameter("embedding.weight", {1, 2, 3, 4, 5, 6}, {3, 2}), make_parameter("norm.weight", {1}, {1})};
  std::vector<ParameterGroup> groups = default_parameter_groups(parameters, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1);
  ASSERT_EQ(groups[0].parameters.size(), 2u);
  EXPECT_EQ(groups[0].parameters[0].name, "linear.weight");
  EXPECT_EQ(groups[0].parameters[1].name, "embedding.weight");
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  ASSERT_EQ(groups[1].parameters.size(), 2u);
  EXPECT_EQ(groups[1].parameters[0].name, "linear.bias");
  EXPECT_EQ(groups[1].parameters[1].name, "norm.weight");
  // The groups hold the live parameters, not copies.
  EXPECT_TRUE(groups[0].parameters[0].tensor.is_same(parameters[0].tensor));
}

TEST(Optimizer, ZeroGradClearsEveryGradient) {
  NamedParameter weight = make_parameter("w", {1, 2}, {2});
  NamedParameter bias = make_parameter("b", {3}, {1});
  set_gradient(weight, {1, 1});
  set_gradient(bias, {1});
  auto optimizer = make_sgd(one_group({weight, bias}), {});
  optimizer->zero_grad();
  EXPECT_FALSE(weight.tensor.grad().defined());
  EXPECT_FALSE(bias.tensor.grad().defined());
}

TEST(Optimizer, RejectsBadParameters) {
  expect_error([] { make_sgd(one_group({make_parameter("w", {1}, {1}), make_parameter("w", {2}, {1})}), {}); },
               "two parameters are named 'w'");
  NamedParameter shared = make_parameter("a", {1}, {1});
  NamedParameter alias = shared;
  alias.name = "b";
  expect_error([&] { make_adamw(one_group({shared, alias}), {}); }, "appears twice");
  NamedParameter ids{.name = "ids", .tensor = Tensor::zeros({2}, kInt64), .layout = Layout::replicate()};
  expect_error([&] { make_adamw(one_group({ids}), {}); }, "only floating");
  expect_error([] { make_sgd(one_group({make_parameter("w", {1}, {1})}), {.momentum = 0, .nesterov = true}); },
               "nesterov");
}

// --- SGD -------------------------------------------------------------------------------------

TEST(Sgd, PlainStepIsLrTimesGradient) {
  NamedParameter weight = make_parameter("w", {1.0, -2.0}, {2});
  auto optimizer = make_sgd(one_group({weight}), {});
  set_gradient(weight, {0.5, 0.25});
  optimizer->step(0.1);
  EXPECT_EQ(weight.tensor.to_vector(), (std::vector<double>{1.0 - 0.1 * 0.5, -2.0 - 0.1 * 0.25}));
  EXPECT_EQ(optimizer->steps_taken(), 1);
  EXPECT_EQ(optimizer->state_dict().size(), 1u);  // only "step": no momentum buffer without momentum
}

TEST(Sgd, MomentumAccumulatesTheBuffer) {
  NamedParameter weight = make_parameter("w", {1.0}, {1});
  auto optimizer = make_sgd(one_group({weight}), {.momentum = 0.9});
  set_gradient(weight, {0.5});
  optimizer->step(0.1);
  double buffer = 0.5;  // the first buffer is the gradient itself
  double expected = 1.0 - 0.1 * buffer;
  EXPECT_DOUBLE_EQ(weight.tensor.item(), expected);
  set_gradient(weight, {-0.25});
  optimizer->step(0.1);
  buffer = 0.9 * buffer + -0.25;
  expected = expected - 0.1 * buffer;
  EXPECT_DOUBLE_EQ(weight.tensor.item(), expected);
  EXPECT_DOUBLE_EQ(optimizer->state_dict().at("w.momentum_buffer").item(), buffer);
}

TEST(Sgd, NesterovLooksAhead) {
  NamedParameter weight = make_parameter("w", {1.0}, {1});
  auto optimizer = make_sgd(one_group({weight}), {.momentum = 0.9, .nesterov = true});
  set_gradient(weight, {0.5});
  optimizer->step(0.1);
  double buffer = 0.5;
  double expected = 1.0 - 0.1 * (0.5 + 0.9 * buffer);  // 0.905
  EXPECT_DOUBLE_EQ(weight.tensor.item(), expected);
  set_gradient(weight, {-0.25});
  optimizer->step(0.1);
  buffer = 0.9 * buffer - 0.25;
  expected = expected - 0.1 * (-0.25 + 0.9 * buffer);  // 0.912
  EXPECT_DOUBLE_EQ(weight.tensor.item(), expected);
  EXPECT_NEAR(expected, 0.912, 1e-12);
}

TEST(Sgd, WeightDecayIsAddedToTheGradient) {
  // PyTorch's SGD convention (L2): d = g + wd * p, then momentum, then p -= lr * d.
  NamedParameter weight = make_parameter("w", {2.0}, {1});
  NamedParameter bias = make_parameter("b", {2.0}, {1});
  std::vector<ParameterGroup> groups = {ParameterGroup{.parameters = {weight}, .weight_decay = 0.1},
                                        ParameterGroup{.parameters = {bias}, .weight_decay = 0.0}};
  auto optimizer = make_sgd(groups, {.momentum = 0.9});
  set_gradient(weight, {0.5});
  set_gradient(bias, {0.5});
  optimizer->step(0.1);
  EXPECT_DOUBLE_EQ(weight.tensor.item(), 2.0 - 0.1 * (0.5 + 0.1 * 2.0));  // 1.93
  EXPECT_DOUBLE_EQ(bias.tensor.item(), 2.0 - 0.1 * 0.5);
}

TEST(Sgd, ParametersWithoutGradientAreSkipped) {
  NamedParameter weight = make_parameter("w", {2.0}, {1});
  auto optimizer = make_sgd(one_group({weight}, 0.5), {.momentum = 0.9});
  optimizer->step(0.1);  // no gradient: not even the weight decay applies
  EXPECT_EQ(weight.tensor.item(), 2.0);
  EXPECT_EQ(optimizer->state_dict().at("w.momentum_buffer").item(), 0.0);
}

// --- AdamW -----------------------------------------------------------------------------------

// The update of adamw.h written out with bias corrections, for one element.
struct AdamReference {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double m = 0, v = 0;
  int step = 0;
  double update(double p, double g, double lr, double weight_decay) {
    step += 1;
    p *= 1.0 - lr * weight_decay;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double m_hat = m / (1 - std::pow(beta1, step));
    const double v_hat = v / (1 - std::pow(beta2, step));
    return p - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST(AdamW, BiasCorrectionAtStepsOneAndTwo) {
  NamedParameter weight = make_parameter("w", {1.0, -3.0}, {2});
  auto optimizer = make_adamw(one_group({weight}), {});
  // Step 1: m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps): about lr, whatever |g|.
  set_gradient(weight, {0.5, -4.0});
  optimizer->step(0.1);
  std::vector<double> values = weight.tensor.to_vector();
  EXPECT_NEAR(values[0], 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(values[1], -3.0 + 0.1 * 4.0 / (4.0 + 1e-8), 1e-15);
  EXPECT_NEAR(values[0], 0.9, 1e-8);

  AdamReference first, second;
  double expected0 = first.update(1.0, 0.5, 0.1, 0.0);
  double expected1 = second.update(-3.0, -4.0, 0.1, 0.0);
  set_gradient(weight, {-0.25, 1.0});
  optimizer->step(0.05);
  expected0 = first.update(expected0, -0.25, 0.05, 0.0);
  expected1 = second.update(expected1, 1.0, 0.05, 0.0);
  values = weight.tensor.to_vector();
  EXPECT_NEAR(values[0], expected0, 1e-15);
  EXPECT_NEAR(values[1], expected1, 1e-15);
  std::map<std::string, Tensor> state = optimizer->state_dict();
  EXPECT_NEAR(state.at("w.exp_avg").to_vector()[0], first.m, 1e-17);
  EXPECT_NEAR(state.at("w.exp_avg_sq").to_vector()[0], first.v, 1e-18);
  EXPECT_EQ(state.at("w.exp_avg").dtype(), kFloat64);  // f64 parameters keep f64 state
  EXPECT_EQ(state.at("w.step").item(), 2.0);
  EXPECT_EQ(state.at("step").item(), 2.0);
  EXPECT_EQ(state.count("w.master"), 0u);
}

TEST(Optimizer, AGuardThatIsNotFiniteSkipsTheUpdateOnTheDeviceAndUndoForgetsItsCounts) {
  for (const bool adamw : {true, false}) {
    NamedParameter guarded = make_parameter("w", {1.0, -3.0}, {2});
    NamedParameter plain = make_parameter("w", {1.0, -3.0}, {2});
    auto make = [adamw](NamedParameter parameter) {
      return adamw ? make_adamw(one_group({parameter}), {}) : make_sgd(one_group({parameter}), {0.9, false});
    };
    auto guarded_optimizer = make(guarded);
    auto plain_optimizer = make(plain);
    // A finite guard: the update applies, as without one.
    set_gradient(guarded, {0.5, -4.0});
    set_gradient(plain, {0.5, -4.0});
    guarded_optimizer->step(0.1, Tensor::full({1}, 2.5, kFloat64));
    plain_optimizer->step(0.1);
    EXPECT_EQ(guarded.tensor.to_vector(), plain.tensor.to_vector());
    // A NaN guard: nothing changes, not the parameter and not the state; undo takes back the count.
    const auto before = guarded_optimizer->state_dict();
    const std::vector<double> values = guarded.tensor.to_vector();
    set_gradient(guarded, {7.0, 7.0});
    guarded_optimizer->step(0.1, Tensor::full({1}, std::nan(""), kFloat64));
    EXPECT_EQ(guarded.tensor.to_vector(), values);
    guarded_optimizer->undo_step();
    const auto after = guarded_optimizer->state_dict();
    for (const auto& [name, tensor] : before) EXPECT_EQ(tensor.to_vector(), after.at(name).to_vector()) << name;
    EXPECT_EQ(guarded_optimizer->steps_taken(), 1);
    // The skipped step is gone from the undoable ones: the one before it is the only one left.
    EXPECT_THROW(guarded_optimizer->undo_step(1), weft::Error);
    // The next step is the second for both, with the same bias corrections.
    set_gradient(guarded, {-0.25, 1.0});
    set_gradient(plain, {-0.25, 1.0});
    guarded_optimizer->step(0.05, Tensor::full({1}, 1.0, kFloat64));
    plain_optimizer->step(0.05);
    EXPECT_EQ(guarded.tensor.to_vector(), plain.tensor.to_vector()) << (adamw ? "adamw" : "sgd");
  }
}

// Steps in flight: a step issued before the host knew the one before it was skipped passes that
// step's guard as its previous guard, and updates exactly as a step issued after undo_step would;
// the host then takes the skipped step's counts back with undo_step(1). Both optimizers, with the
// skipped step the first (AdamW's counts then restart at 1) and a later one.
TEST(Optimizer, APreviousGuardThatIsNotFiniteUpdatesAsAfterTheSkippedStepsUndo) {
  const Tensor finite = Tensor::full({1}, 2.5, kFloat64);
  const Tensor nan = Tensor::full({1}, std::nan(""), kFloat64);
  for (const bool adamw : {true, false}) {
    for (const int skipped : {1, 3}) {
      const std::string run = std::string(adamw ? "adamw" : "sgd") + ", step " + std::to_string(skipped) + " skipped";
      NamedParameter one_at_a_time = make_parameter("w", {1.0, -3.0}, {2});
      NamedParameter in_flight = make_parameter("w", {1.0, -3.0}, {2});
      auto make = [adamw](NamedParameter parameter) {
        return adamw ? make_adamw(one_group({parameter}), {}) : make_sgd(one_group({parameter}), {0.9, false});
      };
      auto reference = make(one_at_a_time);
      auto optimizer = make(in_flight);
      const std::vector<std::vector<double>> gradients = {{0.5, -4.0}, {7.0, 7.0}, {-0.25, 1.0}, {2.0, 0.125},
                                                          {-1.5, 3.0}};
      Tensor previous;  // the guard of the step in flight before this one
      for (int step = 1; step <= static_cast<int>(gradients.size()); ++step) {
        const Tensor guard = step == skipped ? nan : finite;
        set_gradient(one_at_a_time, gradients[static_cast<size_t>(step - 1)]);
        set_gradient(in_flight, gradients[static_cast<size_t>(step - 1)]);
        reference->step(0.1, guard);
        if (step == skipped) reference->undo_step();  // read before the next step is issued
        optimizer->step(0.1, guard, previous);
        if (step == skipped + 1) optimizer->undo_step(1);  // read after the next step was issued
        previous = guard;
        EXPECT_EQ(in_flight.tensor.to_vector(), one_at_a_time.tensor.to_vector()) << run << ", step " << step;
      }
      EXPECT_EQ(optimizer->steps_taken(), reference->steps_taken()) << run;
      const auto expected = reference->state_dict();
      for (const auto& [name, tensor] : optimizer->state_dict()) {
        EXPECT_EQ(tensor.to_vector(), expected.at(name).to_vector()) << run << ": " << name;
      }
    }
  }
}

TEST(AdamW, TheStepBeforeTheLastCanBeUndoneOnceAndNoFurther) {
  NamedParameter weight = make_parameter("w", {1.0, -3.0}, {2});
  auto optimizer = make_adamw(one_group({weight}), {});
  for (int step = 0; step < 3; ++step) {
    set_gradient(weight, {0.5, -4.0});
    optimizer->step(0.1);
  }
  optimizer->undo_step(1);  // the second step
  EXPECT_EQ(optimizer->state_dict().at("w.step").item(), 2.0);
  EXPECT_THROW(optimizer->undo_step(1), weft::Error);  // the first step is past the window
  optimizer->undo_step(0);                             // the third
  EXPECT_EQ(optimizer->state_dict().at("w.step").item(), 1.0);
  EXPECT_THROW(optimizer->undo_step(0), weft::Error);
}

TEST(AdamW, DecoupledDecayOnMatricesOnly) {
  NamedParameter matrix = make_parameter("linear.weight", {1, 2, 3, 4}, {2, 2});
  NamedParameter bias = make_parameter("linear.bias", {1, 2}, {2});
  auto optimizer = make_adamw(default_parameter_groups({matrix, bias}, 0.5), {});
  // Zero gradients: the Adam step is 0 / (0 + eps) = 0, so only the decay moves anything.
  set_gradient(matrix, {0, 0, 0, 0});
  set_gradient(bias, {0, 0});
  optimizer->step(0.1);
  const double factor = 1.0 - 0.1 * 0.5;
  EXPECT_EQ(matrix.tensor.to_vector(), (std::vector<double>{1 * factor, 2 * factor, 3 * factor, 4 * factor}));
  EXPECT_EQ(bias.tensor.to_vector(), (std::vector<double>{1, 2}));

  // With gradients: the decay multiplies p before the Adam step (it is not added to g). Both
  // parameters are at their second step with zero moments so far.
  AdamReference matrix_reference, bias_reference;
  matrix_reference.step = bias_reference.step = 1;
  set_gradient(matrix, {0.3, 0, 0, 0});
  set_gradient(bias, {0.3, 0});
  optimizer->step(0.1);
  EXPECT_NEAR(matrix.tensor.to_vector()[0], matrix_reference.update(1 * factor, 0.3, 0.1, 0.5), 1e-15);
  EXPECT_NEAR(bias.tensor.to_vector()[0], bias_reference.update(1.0, 0.3, 0.1, 0.0), 1e-15);
  EXPECT_EQ(bias.tensor.to_vector()[1], 2.0);
}

TEST(AdamW, EachParameterCountsItsOwnSteps) {
  // As in PyTorch: a parameter first updated at the optimizer's second step gets the bias
  // correction of its own first update.
  NamedParameter early = make_parameter("early", {1.0}, {1});
  NamedParameter late = make_parameter("late", {1.0}, {1});
  auto optimizer = make_adamw(one_group({early, late}), {});
  set_gradient(early, {0.5});
  optimizer->step(0.1);
  EXPECT_EQ(late.tensor.item(), 1.0);
  set_gradient(late, {0.5});
  optimizer->step(0.1);
  EXPECT_NEAR(late.tensor.item(), 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_EQ(optimizer->state_dict().at("late.step").item(), 1.0);
  EXPECT_EQ(optimizer->state_dict().at("early.step").item(), 2.0);
}

TEST(AdamW, F32ParametersKeepF32StateAndAcceptBf16Gradients) {
  NamedParameter weight = make_parameter("w", {1.0, 2.0}, {2}, kFloat32);
  auto optimizer = make_adamw(one_group({weight}), {});
  set_gradient(weight, {0.5, -0.5}, kBFloat16);
  optimizer->step(0.01);
  EXPECT_EQ(optimizer->state_dict().at("w.exp_avg").dtype(), kFloat32);
  EXPECT_NEAR(weight.tensor.to_vector()[0], 0.99, 1e-6);
  EXPECT_NEAR(weight.tensor.to_vector()[1], 2.01, 1e-6);
}

TEST(AdamW, UpdateChecksItsState) {
  // (A tensor on another device cannot be made in a CPU-only build, so the "CUDA optimizer kernel
  // is not built yet" error of adamw_update / sgd_update is not reachable from this test.)
  NamedParameter weight = make_parameter("w", {1.0}, {1});
  set_gradient(weight, {1.0});
  Tensor exp_avg = Tensor::zeros({1}, kFloat64);
  Tensor wrong_state = Tensor::zeros({1}, kFloat32);  // f64 parameters need f64 state
  expect_error([&] { adamw_update(weight.tensor, weight.tensor.grad(), exp_avg, wrong_state, Tensor(), {}); },
               "does not fit");
  Tensor bf16 = Tensor::ones({1}, kBFloat16);
  expect_error([&] { adamw_update(bf16, Tensor::ones({1}), Tensor::zeros({1}), Tensor::zeros({1}), Tensor(), {}); },
               "a bf16 parameter needs an i16 master");
  // An f32 master (the storage before masters were split) is refused for bf16, named as such.
  expect_error([&] {
    adamw_update(bf16, Tensor::ones({1}), Tensor::zeros({1}), Tensor::zeros({1}), Tensor::zeros({1}), {});
  }, "got f32[1]");
}

// --- Master weights --------------------------------------------------------------------------

TEST(MasterWeights, TinyUpdatesAccumulateUntilTheBf16ValueMoves) {
  // bf16 values just below 1.0 are 2^-8 apart, so a step of 1e-3 rounds back to 1.0 every time:
  // without a master copy the parameter would never move.
  ASSERT_EQ(static_cast<float>(BFloat16(1.0f - 1e-3f)), 1.0f);
  NamedParameter weight = make_parameter("w", {1.0, 1.0, 1.0}, {3}, kBFloat16);
  auto optimizer = make_adamw(one_group({weight}), {});
  // A constant gradient makes every Adam step lr * g / (|g| + eps), i.e. about lr.
  set_gradient(weight, {1.0, 1.0, 1.0}, kBFloat16);
  optimizer->step(1e-3);
  EXPECT_EQ(weight.tensor.to_vector(), (std::vector<double>{1.0, 1.0, 1.0}));
  Tensor master = optimizer->state_dict().at("w.master");
  EXPECT_EQ(master.dtype(), kFloat32);
  EXPECT_NEAR(master.to_vector()[0], 0.999, 1e-6);
  for (int step = 1; step < 10; ++step) optimizer->step(1e-3);
  master = optimizer->state_dict().at("w.master");
  EXPECT_NEAR(master.to_vector()[0], 0.99, 1e-5);
  EXPECT_LT(weight.tensor.to_vector()[0], 1.0);
  // The parameter is the master rounded once.
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(weight.tensor.to_vector()[i], static_cast<double>(static_cast<float>(
                                                BFloat16(static_cast<float>(master.to_vector()[i])))));
  }
  EXPECT_EQ(optimizer->state_dict().at("w.exp_avg").dtype(), kFloat32);
}

TEST(MasterWeights, SgdAndF16UseMastersToo) {
  NamedParameter bf16 = make_parameter("a", {1.0}, {1}, kBFloat16);
  NamedParameter f16 = make_parameter("b", {1000.0}, {1}, kFloat16);  // f16 spacing at 1000 is 0.5
  auto optimizer = make_sgd(one_group({bf16, f16}), {.momentum = 0.0});
  for (int step = 0; step < 20; ++step) {
    set_gradient(bf16, {1.0});
    set_gradient(f16, {1.0});
    optimizer->step(1e-3 * (step < 10 ? 1 : 100));  // 10 steps of 1e-3, then 10 of 0.1
  }
  std::map<std::string, Tensor> state = optimizer->state_dict();
  EXPECT_NEAR(state.at("a.master").item(), 1.0 - 10 * 1e-3 - 10 * 0.1, 1e-5);
  EXPECT_NEAR(state.at("b.master").item(), 1000.0 - 10 * 1e-3 - 10 * 0.1, 1e-3);
  EXPECT_EQ(f16.tensor.item(), 999.0);  // 998.99 rounded to the f16 grid
}

TEST(MasterWeights, AnOutsideWriteToTheParameterWins) {
  // Loading weights after the optimizer was built must not be undone by a stale master. For bf16
  // the master is the written value plus the low half it had: within half a bf16 step of it.
  NamedParameter weight = make_parameter("w", {1.0, 1.0}, {2}, kBFloat16);
  auto optimizer = make_sgd(one_group({weight}), {});
  set_gradient(weight, {1.0, 1.0});
  optimizer->step(1e-3);
  Tensor loaded = weight.tensor;
  loaded.set({0}, 2.0);  // element 0 changes, element 1 keeps its rounding
  const std::vector<double> written = optimizer->state_dict().at("w.master").to_vector();
  EXPECT_NEAR(written[0], 2.0, std::ldexp(1.0, -8));  // half of bf16's step of 2^-7 at 2
  EXPECT_NEAR(written[1], 1.0 - 1e-3, 1e-7);
  optimizer->step(1e-3);
  const std::vector<double> master = optimizer->state_dict().at("w.master").to_vector();
  EXPECT_NEAR(master[0], written[0] - 1e-3, 1e-6);
  EXPECT_NEAR(master[1], 1.0 - 2e-3, 1e-6);
  // Both round to the parameter: the first to 2.0, the second (just under the midpoint of
  // 0.99609375 and 1.0) to 0.99609375.
  EXPECT_EQ(weight.tensor.to_vector(), (std::vector<double>{2.0, 0.99609375}));
  // f16 keeps an f32 master, which restarts exactly from a written value.
  NamedParameter half = make_parameter("h", {1.0}, {1}, kFloat16);
  auto half_optimizer = make_sgd(one_group({half}), {});
  set_gradient(half, {1.0});
  half_optimizer->step(1e-3);
  Tensor half_loaded = half.tensor;
  half_loaded.set({0}, 2.0);
  half_optimizer->step(1e-3);
  EXPECT_NEAR(half_optimizer->state_dict().at("h.master").item(), 2.0 - 1e-3, 1e-6);
}

// The split master (bf16 parameter + i16 low halves) is an f32 master to the bit: AdamW on bf16
// parameters gives the f32 run's values, rounded to nearest with ties away from zero, as parameter
// and master, step after step (the f32 run is the same update on f32 parameters, whose arithmetic
// is the master's).
TEST(MasterWeights, SplitMastersTrainBitForBitAsF32Masters) {
  const std::vector<int64_t> shape = {64, 33};
  const Tensor initial = Tensor::normal(shape, 21, 0, 0.0, 0.05).to(kBFloat16);  // on the bf16 grid
  NamedParameter bf16{.name = "w", .tensor = initial.clone(), .layout = Layout::replicate()};
  NamedParameter f32{.name = "w", .tensor = initial.to(kFloat32), .layout = Layout::replicate()};
  bf16.tensor.set_requires_grad(true);
  f32.tensor.set_requires_grad(true);
  auto split = make_adamw(one_group({bf16}, 0.1), {0.9, 0.95, 1e-8});
  auto reference = make_adamw(one_group({f32}, 0.1), {0.9, 0.95, 1e-8});
  for (int step = 0; step < 25; ++step) {
    // Gradients on the bf16 grid, so that both runs read the same values; some steps small enough
    // that the parameter only moves through the master.
    const double size = step % 3 == 0 ? 1e-6 : 1e-2;
    const Tensor grad = Tensor::normal(shape, 100 + step, 0, 0.0, size).to(kBFloat16);
    bf16.tensor.set_grad(grad);
    f32.tensor.set_grad(grad.to(kFloat32));
    split->step(3e-3);
    reference->step(3e-3);
    const std::vector<double> expected = f32.tensor.to_vector();
    const std::vector<double> master = split->state_dict().at("w.master").to_vector();
    const std::vector<double> parameter = bf16.tensor.to_vector();
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(master[i], expected[i]) << "step " << step << " element " << i;
      const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(expected[i]));
      const float rounded = std::bit_cast<float>(static_cast<uint32_t>(master_high_half(bits)) << 16);
      ASSERT_EQ(parameter[i], rounded) << "step " << step << " element " << i;
    }
  }
  // And the moments, which do not depend on how the master is kept.
  EXPECT_EQ(split->state_dict().at("w.exp_avg_sq").to_vector(), reference->state_dict().at("w.exp_avg_sq").to_vector());
  // The low halves cost 2 bytes a parameter: the master's storage is i16, and the optimizer's state
  // is counted as stored (moments 4 + 4, master 2 bytes a parameter; the step count one i64).
  EXPECT_EQ(make_master_weights(bf16.tensor).dtype(), kInt16);
  EXPECT_EQ(split->state_bytes(), 64 * 33 * (4 + 4 + 2) + 8);
  EXPECT_EQ(reference->state_bytes(), 64 * 33 * (4 + 4) + 8);
  EXPECT_EQ(make_master_weights(Tensor::zeros({2}, kFloat16)).dtype(), kFloat32);
}

TEST(MasterWeights, AStateDictLoadsIntoSplitMastersExactly) {
  // f32 master values saved from one optimizer come back into another's low halves bit for bit,
  // and a state dict of the wrong master dtype is refused with nothing loaded.
  const Tensor initial = Tensor::normal({5, 7}, 3, 0, 0.0, 0.1).to(kBFloat16);
  NamedParameter first{.name = "w", .tensor = initial.clone(), .layout = Layout::replicate()};
  first.tensor.set_requires_grad(true);
  auto optimizer = make_adamw(one_group({first}), {});
  for (int step = 0; step < 4; ++step) {
    first.tensor.set_grad(Tensor::normal({5, 7}, 50 + step, 0, 0.0, 1e-3).to(kBFloat16));
    optimizer->step(1e-3);
  }
  const std::map<std::string, Tensor> saved = optimizer->state_dict();
  EXPECT_EQ(saved.at("w.master").dtype(), kFloat32);
  NamedParameter second{.name = "w", .tensor = first.tensor.detach().clone(), .layout = Layout::replicate()};
  second.tensor.set_requires_grad(true);
  auto restored = make_adamw(one_group({second}), {});
  restored->load_state_dict(saved);
  EXPECT_EQ(restored->state_dict().at("w.master").to_vector(), saved.at("w.master").to_vector());
  std::map<std::string, Tensor> wrong = saved;
  wrong["w.master"] = saved.at("w.master").to(kBFloat16);
  expect_error([&] { restored->load_state_dict(wrong); }, "'w.master' is bf16[5, 7] cpu, expected f32[5, 7]");
}

// --- Checkpoints -----------------------------------------------------------------------------

// Builds fresh parameters with `values`, an optimizer over them, and runs `steps` steps starting at
// step index `first_step` with synthetic gradients.
struct TrainingRun {
  std::vector<NamedParameter> parameters;
  std::unique_ptr<Optimizer> optimizer;
  void steps(int first_step, int count) {
    for (int step = first_step; step < first_step + count; ++step) {
      for (size_t i = 0; i < parameters.size(); ++i) {
        Tensor tensor = parameters[i].tensor;
        tensor.set_grad(synthetic_gradient(tensor, step, static_cast<int>(i)));
      }
      optimizer->step(0.01 * (1.0 + step));
    }
  }
};

std::vector<NamedParameter> checkpoint_parameters() {
  NamedParameter matrix{.name = "matrix", .tensor = Tensor::normal({3, 2}, 5, 0), .layout = Layout::replicate()};
  NamedParameter bias{.name = "bias", .tensor = Tensor::normal({3}, 5, 100, 0, 1, kBFloat16),
                      .layout = Layout::replicate()};
  matrix.tensor.set_requires_grad(true);
  bias.tensor.set_requires_grad(true);
  return {matrix, bias};
}

std::vector<NamedParameter> copies_of(const std::vector<NamedParameter>& parameters) {
  std::vector<NamedParameter> copies;
  for (const NamedParameter& parameter : parameters) {
    NamedParameter copy = parameter;
    copy.tensor = parameter.tensor.detach().clone();
    copy.tensor.set_requires_grad(true);
    copies.push_back(copy);
  }
  return copies;
}

void expect_resume_is_bit_exact(
    const std::function<std::unique_ptr<Optimizer>(const std::vector<NamedParameter>&)>& make) {
  TrainingRun straight;
  straight.parameters = checkpoint_parameters();
  straight.optimizer = make(straight.parameters);
  straight.steps(0, 3);
  const std::map<std::string, Tensor> state = straight.optimizer->state_dict();
  TrainingRun resumed;
  resumed.parameters = copies_of(straight.parameters);
  straight.steps(3, 3);  // changes the live state; `state` is a snapshot and must not follow
  resumed.optimizer = make(resumed.parameters);
  resumed.optimizer->load_state_dict(state);
  EXPECT_EQ(resumed.optimizer->steps_taken(), 3);
  resumed.steps(3, 3);
  for (size_t i = 0; i < straight.parameters.size(); ++i) {
    EXPECT_EQ(straight.parameters[i].tensor.to_vector(), resumed.parameters[i].tensor.to_vector())
        << straight.parameters[i].name;
  }
  const std::map<std::string, Tensor> final_straight = straight.optimizer->state_dict();
  const std::map<std::string, Tensor> final_resumed = resumed.optimizer->state_dict();
  ASSERT_EQ(final_straight.size(), final_resumed.size());
  for (const auto& [key, tensor] : final_straight) {
    EXPECT_EQ(tensor.to_vector(), final_resumed.at(key).to_vector()) << key;
  }
}

TEST(OptimizerState, AdamWResumeIsBitExact) {
  expect_resume_is_bit_exact([](const std::vector<NamedParameter>& parameters) {
    return make_adamw(default_parameter_groups(parameters, 0.1), {});
  });
}

TEST(OptimizerState, SgdResumeIsBitExact) {
  expect_resume_is_bit_exact([](const std::vector<NamedParameter>& parameters) {
    return make_sgd(default_parameter_groups(parameters, 0.01), {.momentum = 0.9, .nesterov = true});
  });
}

TEST(OptimizerState, StateDictNamesEveryEntry) {
  auto optimizer = make_adamw(default_parameter_groups(checkpoint_parameters(), 0.1), {});
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : optimizer->state_dict()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"bias.exp_avg", "bias.exp_avg_sq", "bias.master", "bias.step",
                                            "matrix.exp_avg", "matrix.exp_avg_sq", "matrix.step", "step"}));
}

TEST(OptimizerState, MismatchedStateIsAnErrorAndLoadsNothing) {
  TrainingRun run;
  run.parameters = checkpoint_parameters();
  run.optimizer = make_adamw(default_parameter_groups(run.parameters, 0.1), {});
  run.steps(0, 2);
  const std::map<std::string, Tensor> good = run.optimizer->state_dict();

  auto expect_load_error = [&](const std::map<std::string, Tensor>& state, const std::string& fragment) {
    expect_error([&] { run.optimizer->load_state_dict(state); }, fragment);
  };
  std::map<std::string, Tensor> missing = good;
  missing.erase("matrix.exp_avg_sq");
  expect_load_error(missing, "missing 'matrix.exp_avg_sq'");

  std::map<std::string, Tensor> wrong_shape = good;
  wrong_shape["matrix.exp_avg"] = Tensor::zeros({2, 3});
  expect_load_error(wrong_shape, "'matrix.exp_avg' is f32[2, 3]");

  std::map<std::string, Tensor> wrong_dtype = good;
  wrong_dtype["bias.master"] = Tensor::zeros({3}, kFloat64);
  expect_load_error(wrong_dtype, "'bias.master'");

  std::map<std::string, Tensor> unexpected = good;
  unexpected["decoder.weight.exp_avg"] = Tensor::zeros({1});
  expect_load_error(unexpected, "unexpected 'decoder.weight.exp_avg'");

  std::map<std::string, Tensor> no_step = good;
  no_step.erase("step");
  expect_load_error(no_step, "missing 'step'");

  // A failed load changed nothing, even where its own entries were fine.
  std::map<std::string, Tensor> partly_good = wrong_shape;
  partly_good["matrix.exp_avg_sq"] = Tensor::full({3, 2}, 123.0);
  partly_good["step"] = Tensor::scalar(40, kInt64);
  expect_load_error(partly_good, "nothing was loaded");
  const std::map<std::string, Tensor> after = run.optimizer->state_dict();
  for (const auto& [key, tensor] : good) EXPECT_EQ(tensor.to_vector(), after.at(key).to_vector()) << key;
  EXPECT_EQ(run.optimizer->steps_taken(), 2);

  // State from SGD is not AdamW's.
  auto sgd = make_sgd(default_parameter_groups(copies_of(run.parameters), 0.1), {.momentum = 0.9});
  expect_error([&] { sgd->load_state_dict(good); }, "unexpected 'matrix.exp_avg'");
}

// --- Learning-rate schedules -----------------------------------------------------------------

TEST(LearningRateSchedule, WarmupIsLinearFromTheFirstStep) {
  LearningRateSchedule schedule(1.0, 10, 110, ScheduleKind::kCosine, 0.1);
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.1);
  EXPECT_DOUBLE_EQ(schedule.at(4), 0.5);
  EXPECT_DOUBLE_EQ(schedule.at(9), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1.0);  // decay starts from the peak
}

TEST(LearningRateSchedule, CosineDecaysToTheMinimumRatio) {
  LearningRateSchedule schedule(6e-4, 10, 110, "cosine", 0.1);
  EXPECT_DOUBLE_EQ(schedule.at(60), 6e-5 + (6e-4 - 6e-5) * 0.5);  // midpoint: halfway between
  EXPECT_DOUBLE_EQ(schedule.at(35), 6e-5 + (6e-4 - 6e-5) * 0.5 * (1 + std::cos(std::numbers::pi / 4)));
  EXPECT_DOUBLE_EQ(schedule.at(110), 6e-5);
  EXPECT_DOUBLE_EQ(schedule.at(5000), 6e-5);
  EXPECT_DOUBLE_EQ(schedule.min_lr(), 6e-5);
  for (int64_t step = 11; step <= 110; ++step) EXPECT_LT(schedule.at(step), schedule.at(step - 1));
}

TEST(LearningRateSchedule, LinearAndConstant) {
  LearningRateSchedule linear(1.0, 10, 110, "linear", 0.1);
  EXPECT_DOUBLE_EQ(linear.at(60), 0.55);
  EXPECT_DOUBLE_EQ(linear.at(35), 1.0 - 0.9 * 0.25);
  EXPECT_DOUBLE_EQ(linear.at(110), 0.1);
  EXPECT_DOUBLE_EQ(linear.at(200), 0.1);
  LearningRateSchedule constant(3e-4, 5, 0, "constant");
  EXPECT_DOUBLE_EQ(constant.at(0), 3e-4 / 5);
  EXPECT_DOUBLE_EQ(constant.at(5), 3e-4);
  EXPECT_DOUBLE_EQ(constant.at(1000000), 3e-4);
  LearningRateSchedule no_warmup(1.0, 0, 100, "cosine", 0.0);
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 1.0);
  EXPECT_DOUBLE_EQ(no_warmup.at(100), 0.0);
  LearningRateSchedule no_decay_room(1.0, 10, 10, "linear", 0.5);
  EXPECT_DOUBLE_EQ(no_decay_room.at(9), 1.0);
  EXPECT_DOUBLE_EQ(no_decay_room.at(10), 0.5);
}

TEST(LearningRateSchedule, BadSettingsAreErrors) {
  expect_error([] { LearningRateSchedule(1.0, 10, 100, "cosin"); }, "valid kinds: cosine, linear, constant");
  expect_error([] { LearningRateSchedule(1.0, 100, 10, "cosine"); }, "total_steps (10)");
  expect_error([] { LearningRateSchedule(1.0, 10, 100, "cosine", 1.5); }, "min_lr_ratio");
  expect_error([] { LearningRateSchedule(-1.0, 10, 100, "cosine"); }, "lr must be");
  expect_error([] { LearningRateSchedule(1.0, 10, 100, "cosine").at(-1); }, "step must be");
}

// --- Gradient clipping -----------------------------------------------------------------------

struct ClipFixture {
  NamedParameter a = make_parameter("a", {0, 0}, {2});
  NamedParameter b = make_parameter("b", {0}, {1});
  NamedParameter no_grad = make_parameter("c", {0}, {1});
  ClipFixture() {
    set_gradient(a, {3, 4});
    set_gradient(b, {12});
  }
  std::vector<Tensor> parameters() const { return {a.tensor, b.tensor, no_grad.tensor}; }
};

TEST(GradientClipping, ScalesToTheMaximumNorm) {
  ClipFixture fixture;
  EXPECT_DOUBLE_EQ(clip_grad_norm(fixture.parameters(), 6.5), 13.0);  // sqrt(9 + 16 + 144)
  const double factor = 6.5 / (13.0 + 1e-6);
  EXPECT_DOUBLE_EQ(fixture.a.tensor.grad().to_vector()[0], 3 * factor);
  EXPECT_DOUBLE_EQ(fixture.a.tensor.grad().to_vector()[1], 4 * factor);
  EXPECT_DOUBLE_EQ(fixture.b.tensor.grad().item(), 12 * factor);
  EXPECT_NEAR(clip_grad_norm(fixture.parameters(), 0.0), 6.5, 1e-6);  // 0: measure only
}

TEST(GradientClipping, ClipToNormDecidesFromTheSquaresAsClipGradNormDoes) {
  // The backend's clip_to_norm (no host read on a device) against clip_grad_norm, bit for bit.
  for (const double max_norm : {6.5, 13.5, 0.0}) {
    ClipFixture expected, actual;
    clip_grad_norm(expected.parameters(), max_norm);
    std::vector<Tensor> grads = {actual.a.tensor.grad(), actual.b.tensor.grad()};  // the defined ones
    Tensor squares = Tensor::empty({static_cast<int64_t>(grads.size())}, kFloat64);
    backend_for(Device::cpu()).squared_norms(grads, squares);
    backend_for(Device::cpu()).clip_to_norm(grads, squares, max_norm);
    EXPECT_EQ(actual.a.tensor.grad().to_vector(), expected.a.tensor.grad().to_vector()) << max_norm;
    EXPECT_EQ(actual.b.tensor.grad().to_vector(), expected.b.tensor.grad().to_vector()) << max_norm;
  }
  ClipFixture fixture;
  EXPECT_THROW(backend_for(Device::cpu()).clip_to_norm({fixture.a.tensor.grad()}, Tensor::zeros({1}, kFloat32), 1.0),
               weft::Error);  // squares in the CPU's accumulation dtype, f64
}

// Clipping handed to AdamW as a factor (Backend::clip_factor, Optimizer::step_with_gradient_scale)
// updates exactly as clipping the gradients first (clip_to_norm, then step) for f32 and f64
// parameters, over and under the limit, and leaves the gradients as they were.
TEST(GradientClipping, AdamWWithTheClipFactorUpdatesAsClippingFirstAndLeavesTheGradients) {
  for (const DType dtype : {kFloat64, kFloat32}) {
    for (const double max_norm : {0.05, 1e3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " max_norm " + std::to_string(max_norm));
      auto run = [&](bool fused) {
        NamedParameter weight = make_parameter("w", {0.5, -1.0, 2.0, 0.25}, {2, 2}, dtype);
        NamedParameter bias = make_parameter("b", {0.1, -0.2}, {2}, dtype);
        auto optimizer = make_adamw(one_group({weight, bias}, 0.1), {});
        EXPECT_TRUE(optimizer->takes_gradient_scale());
        for (int step = 0; step < 3; ++step) {
          weight.tensor.set_grad(synthetic_gradient(weight.tensor, step, 0).to(dtype));
          bias.tensor.set_grad(synthetic_gradient(bias.tensor, step, 1).to(dtype));
          const std::vector<Tensor> grads = {weight.tensor.grad(), bias.tensor.grad()};
          Tensor squares = Tensor::empty({2}, kFloat64);
          backend_for(Device::cpu()).squared_norms(grads, squares);
          if (fused) {
            const std::vector<double> before = weight.tensor.grad().to_vector();
            Tensor factor = Tensor::empty({1}, kFloat64);
            backend_for(Device::cpu()).clip_factor(squares, max_norm, factor);
            optimizer->step_with_gradient_scale(1e-2, Tensor(), factor);
            EXPECT_EQ(weight.tensor.grad().to_vector(), before) << "the gradients are not written";
          } else {
            backend_for(Device::cpu()).clip_to_norm(grads, squares, max_norm);
            optimizer->step(1e-2);
          }
        }
        std::vector<double> values = weight.tensor.to_vector();
        for (double value : bias.tensor.to_vector()) values.push_back(value);
        return values;
      };
      EXPECT_EQ(run(true), run(false));
    }
  }
  // SGD takes no gradient scale and says so.
  NamedParameter weight = make_parameter("w", {1.0}, {1});
  auto sgd = make_sgd(one_group({weight}), {});
  EXPECT_FALSE(sgd->takes_gradient_scale());
  expect_error([&] { sgd->step_with_gradient_scale(0.1, Tensor(), Tensor::ones({1}, kFloat64)); },
               "does not take a gradient scale");
}

TEST(GradientClipping, UnderTheMaximumNothingChanges) {
  ClipFixture fixture;
  EXPECT_DOUBLE_EQ(clip_grad_norm(fixture.parameters(), 13.5), 13.0);
  EXPECT_EQ(fixture.a.tensor.grad().to_vector(), (std::vector<double>{3, 4}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(fixture.parameters(), -1.0), 13.0);
  EXPECT_EQ(fixture.b.tensor.grad().item(), 12.0);
}

TEST(GradientClipping, NonFiniteNormIsReturnedUnscaled) {
  ClipFixture fixture;
  set_gradient(fixture.b, {std::numeric_limits<double>::infinity()});
  EXPECT_EQ(clip_grad_norm(fixture.parameters(), 1.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(fixture.a.tensor.grad().to_vector(), (std::vector<double>{3, 4}));
  set_gradient(fixture.b, {std::nan("")});
  EXPECT_TRUE(std::isnan(clip_grad_norm(fixture.parameters(), 1.0)));
  EXPECT_EQ(fixture.a.tensor.grad().to_vector(), (std::vector<double>{3, 4}));
}

TEST(GradientClipping, LowPrecisionGradientsAreSummedInDouble) {
  // 4096 bf16 gradients of 1: the norm is exactly 64. (A bf16 running sum of the squares would
  // stop growing at 256, where adding 1 no longer changes a bf16 value.)
  NamedParameter weight = make_parameter("w", std::vector<double>(4096, 0.0), {64, 64}, kBFloat16);
  set_gradient(weight, std::vector<double>(4096, 1.0), kBFloat16);
  EXPECT_EQ(clip_grad_norm({weight.tensor}, 0.0), 64.0);
}

// The backend call behind clip_grad_norm: one sum of squares per tensor, read in place whatever the
// dtype and strides, into f64 or f32, and 0 for an empty tensor.
TEST(GradientClipping, SquaredNormsOfMixedTensors) {
  const Tensor wide = Tensor::normal({7, 5}, 41, 0, 0.0, 1.0, kFloat64);
  const Tensor transposed = Tensor::normal({6, 3}, 42, 0, 0.0, 1.0, kFloat32).transpose(0, 1);  // strided view
  const Tensor narrow = Tensor::normal({300}, 43, 0, 0.0, 1.0, kBFloat16);
  const Tensor empty = Tensor::empty({0, 4}, kFloat32);
  const std::vector<Tensor> tensors = {wide, transposed, narrow, empty};
  std::vector<double> expected;
  for (const Tensor& tensor : tensors) {
    double total = 0.0;
    for (double value : tensor.to_vector()) total += value * value;
    expected.push_back(total);
  }
  Backend& cpu = backend_for(Device::cpu());
  Tensor out = Tensor::full({4}, std::nan(""), kFloat64);
  cpu.squared_norms(tensors, out);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(out.to_vector()[i], expected[i]) << i;
  Tensor single = Tensor::full({4}, std::nan(""), kFloat32);
  cpu.squared_norms(tensors, single);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(single.to_vector()[i], static_cast<double>(static_cast<float>(expected[i]))) << i;
  }
  expect_error([&] { cpu.squared_norms(tensors, Tensor::empty({3}, kFloat64)); }, "squared_norms: out must be [4]");
}

// --- Gradient accumulation -------------------------------------------------------------------

TEST(GradientAccumulation, TwoHalfBatchesScaledByHalfEqualTheFullBatch) {
  const Tensor inputs = Tensor::normal({4, 3}, 9, 0, 0, 1, kFloat64);
  const Tensor targets = Tensor::normal({4, 1}, 9, 100, 0, 1, kFloat64);
  auto loss_of = [](const Tensor& weight, const Tensor& x, const Tensor& y) {
    return mean(square(matmul(x, weight) - y));  // mean over the batch: each micro-batch its own mean
  };
  Tensor full = Tensor::normal({3, 1}, 9, 200, 0, 1, kFloat64);
  full.set_requires_grad(true);
  loss_of(full, inputs, targets).backward();

  Tensor accumulated = full.detach().clone();
  accumulated.set_requires_grad(true);
  loss_of(accumulated, inputs.narrow(0, 0, 2), targets.narrow(0, 0, 2)).backward();
  loss_of(accumulated, inputs.narrow(0, 2, 2), targets.narrow(0, 2, 2)).backward();  // .grad += this
  scale_gradients({accumulated}, 0.5);
  const std::vector<double> expected = full.grad().to_vector();
  const std::vector<double> actual = accumulated.grad().to_vector();
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-14) << i;
}

}  // namespace
}  // namespace weft
