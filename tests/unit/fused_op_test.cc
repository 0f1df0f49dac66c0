// The fused ops add_layer_norm, add_rms_norm and linear_gelu on the CPU (the reference backend):
// backward against central finite differences in double precision, and forward equal to the unfused
// composition; the norms' backward folding the residual stream's gradient and accumulating their
// parameters' .grad in place.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "layers/layer_norm.h"
#include "layers/rms_norm.h"
#include "layers/registry.h"
#include "layers/transformer_block.h"
#include "runtime/ops/bias_gradient_handoff.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"
#include "tests/support/small_model_config.h"

namespace weft {
namespace {

using testing::expect_gradients_match;
using testing::max_abs_difference;
using testing::random_leaf;

TEST(FusedOps, AddLayerNormForwardEqualsAddThenLayerNorm) {
  for (bool with_bias : {true, false}) {
    Tensor x = random_leaf({2, 3, 7}, 1), r = random_leaf({2, 3, 7}, 2);
    Tensor w = random_leaf({7}, 3), b = with_bias ? random_leaf({7}, 4) : Tensor();
    auto [sum, out] = add_layer_norm(x, r, w, b, 1e-5);
    const Tensor expected_sum = add(x, r);
    const Tensor expected_out = layer_norm(expected_sum, w, b, 1e-5);
    ASSERT_EQ(sum.shape(), x.shape());
    ASSERT_EQ(out.shape(), x.shape());
    EXPECT_LE(max_abs_difference(sum, expected_sum), 1e-12);
    EXPECT_LE(max_abs_difference(out, expected_out), 1e-12);
    EXPECT_TRUE(sum.requires_grad());
    EXPECT_TRUE(out.requires_grad());
  }
}

TEST(FusedOps, AddLayerNormGradients) {
  Tensor x = random_leaf({2, 3, 7}, 5), r = random_leaf({2, 3, 7}, 6);
  Tensor w = random_leaf({7}, 7), b = random_leaf({7}, 8);
  // Both outputs carry gradient (the sum through a nonlinear use, as a residual stream does).
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        auto [sum, out] = add_layer_norm(in[0], in[1], in[2], in[3]);
        return add(mul(sum, sum), out);
      },
      {x, r, w, b});
  // No bias.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        auto [sum, out] = add_layer_norm(in[0], in[1], in[2], Tensor());
        return add(tanh(sum), out);
      },
      {x, r, w});
  // Only the normalized output used.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return add_layer_norm(in[0], in[1], in[2], in[3], 1e-3).second; },
      {x, r, w, b});
  // Only the sum used (weight and bias get no gradient).
  const Tensor fixed_w = random_leaf({7}, 9, false);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return square(add_layer_norm(in[0], in[1], fixed_w, Tensor()).first); },
      {x, r});
  // Non-contiguous inputs.
  Tensor xt = random_leaf({7, 4}, 10), rt = random_leaf({4, 7}, 11);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        auto [sum, out] = add_layer_norm(in[0].transpose(0, 1), in[1], in[2], in[3]);
        return add(sum, out);
      },
      {xt, rt, w, b});
}

TEST(FusedOps, AddRmsNormForwardEqualsAddThenRmsNormAndItsGradientsMatchFiniteDifferences) {
  Tensor x = random_leaf({2, 3, 7}, 40), r = random_leaf({2, 3, 7}, 41), w = random_leaf({7}, 42);
  auto [sum, out] = add_rms_norm(x, r, w, 1e-6);
  const Tensor expected_sum = add(x, r);
  EXPECT_LE(max_abs_difference(sum, expected_sum), 1e-12);
  EXPECT_LE(max_abs_difference(out, rms_norm(expected_sum, w, 1e-6)), 1e-12);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        auto [sum, out] = add_rms_norm(in[0], in[1], in[2]);
        return add(mul(sum, sum), out);
      },
      {x, r, w});
  expect_gradients_match([](const std::vector<Tensor>& in) { return add_rms_norm(in[0], in[1], in[2]).second; },
                         {x, r, w});
  EXPECT_THROW(add_rms_norm(x, random_leaf({1, 3, 7}, 43), w), Error);
}

// linear_add: residual + linear in one op; bitwise the add of the linear on the CPU, gradients by
// finite differences (the residual's is the output's), with and without a bias.
TEST(FusedOps, LinearAddEqualsTheAddOfTheLinearAndItsGradientsMatchFiniteDifferences) {
  Tensor x = random_leaf({2, 3, 5}, 51), w = random_leaf({4, 5}, 52), b = random_leaf({4}, 53);
  Tensor r = random_leaf({2, 3, 4}, 54);
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    const Tensor fused = linear_add(x, w, bias ? b : Tensor(), r);
    EXPECT_EQ(fused.to_vector(), add(r, linear(x, w, bias ? b : Tensor())).to_vector());
    if (bias) {
      expect_gradients_match(
          [](const std::vector<Tensor>& in) { return mul(linear_add(in[0], in[1], in[2], in[3]), in[3]); }, {x, w, b, r});
    } else {
      expect_gradients_match([](const std::vector<Tensor>& in) { return linear_add(in[0], in[1], Tensor(), in[2]); },
                             {x, w, r});
    }
  }
  EXPECT_THROW(linear_add(x, w, b, random_leaf({2, 3, 5}, 55)), Error);  // the residual must be [2, 3, 4]
}

// A norm whose input already has a gradient from a later op when the norm's backward runs (a
// residual stream: the add after the norm runs its backward first) takes that gradient into its
// own kernel (autograd::take_pending_gradient); the result is the plain chain rule's, checked
// against finite differences, for both norms, with the stream's producer an op and a leaf.
TEST(FusedOps, NormsFoldTheResidualGradientIntoTheirBackward) {
  Tensor x = random_leaf({3, 9}, 44), w = random_leaf({9}, 45), b = random_leaf({9}, 46);
  for (const bool rms : {false, true}) {
    for (const bool leaf_stream : {false, true}) {
      SCOPED_TRACE(std::string(rms ? "rms_norm" : "layer_norm") + (leaf_stream ? ", leaf stream" : ", op stream"));
      expect_gradients_match(
          [&](const std::vector<Tensor>& in) {
            const Tensor stream = leaf_stream ? in[0] : tanh(in[0]);  // [3, 9]
            const Tensor normalized = rms ? rms_norm(stream, in[1]) : layer_norm(stream, in[1], in[2]);
            // The add is created after the norm, so its backward runs first and deposits the
            // stream's gradient before the norm's backward runs.
            return add(mul(stream, stream), scale(normalized, 1.5));
          },
          rms ? std::vector<Tensor>{x, w} : std::vector<Tensor>{x, w, b});
    }
  }
}

// With .grad already there (a second micro-batch), layer_norm and rms_norm add their parameter
// gradients into it in the kernel: two passes give twice one pass's gradient.
TEST(FusedOps, NormParameterGradientsAccumulateIntoAnExistingGrad) {
  for (const bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
    Tensor x = random_leaf({4, 6}, 47), w = random_leaf({6}, 48), b = random_leaf({6}, 49);
    const Tensor g = random_leaf({4, 6}, 50, false);
    auto pass = [&] {
      const Tensor y = rms ? rms_norm(x, w) : layer_norm(x, w, b);
      sum(mul(y, g)).backward();
    };
    pass();
    const Tensor once_w = w.grad().clone(), once_x = x.grad().clone();
    const void* storage_before = w.grad().raw_data();
    pass();
    EXPECT_EQ(w.grad().raw_data(), storage_before) << "the second pass adds into the same .grad";
    EXPECT_LE(max_abs_difference(w.grad(), scale(once_w, 2.0)), 1e-12);
    EXPECT_LE(max_abs_difference(x.grad(), scale(once_x, 2.0)), 1e-12);
    if (!rms) EXPECT_GT(max_abs_difference(b.grad(), Tensor::zeros({6}, kFloat64)), 0.0);
  }
}

// y = x + bias ([..., C] + [C]) whose backward takes its bias gradient from the op that wrote its
// output's gradient where that op offers it (BiasGradientTaker, as a linear does), counting the
// hand-offs.
class RecordingBiasAdd final : public autograd::Function, public BiasGradientTaker {
 public:
  explicit RecordingBiasAdd(int* handoffs) : handoffs_(handoffs) {}
  std::string name() const override { return "RecordingBiasAddBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    columns_ = inputs[1].size(0);
    return {add(inputs[0], inputs[1])};
  }
  Tensor take_bias_gradient_from_output_gradient(DType dtype, int64_t columns) override {
    ++*handoffs_;
    EXPECT_EQ(columns, columns_);
    handed_ = Tensor::empty({columns}, dtype);
    return handed_;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor bias_gradient = handed_.defined() ? std::exchange(handed_, Tensor()) : sum_to_shape(grads[0], {columns_});
    return {grads[0], bias_gradient};
  }

 private:
  int* handoffs_;
  int64_t columns_ = 0;
  Tensor handed_;
};

// A norm's backward sums the columns of the grad_x it writes for the op that produced x, where grad_x
// is all that op receives: x's one use, or x a residual stream whose later use's gradient the norm
// takes (autograd::take_pending_gradient); not where a use's backward runs after the norm's. The
// gradients are those of the plain add either way.
TEST(FusedOps, NormsHandTheirInputsProducerItsBiasGradient) {
  struct Case {
    const char* name;
    int second_use;  // 0 none, +1 created after the norm (a residual stream), -1 created before it
    int handoffs;
  };
  for (const bool rms : {false, true}) {
    for (const Case& c : {Case{"one use", 0, 1}, Case{"a residual stream", 1, 1}, Case{"a use after the norm's", -1, 0}}) {
      SCOPED_TRACE(std::string(rms ? "rms_norm, " : "layer_norm, ") + c.name);
      const Tensor x = random_leaf({2, 3, 5}, 60), b = random_leaf({5}, 61), w = random_leaf({5}, 62),
                   nb = random_leaf({5}, 63);
      const Tensor out_weights = random_leaf({2, 3, 5}, 64, false);
      auto loss_of = [&](const Tensor& stream) {
        Tensor loss = c.second_use < 0 ? sum(mul(stream, stream)) : Tensor();
        const Tensor normalized = rms ? rms_norm(stream, w) : layer_norm(stream, w, nb);
        const Tensor term = sum(mul(normalized, out_weights));
        loss = loss.defined() ? add(loss, term) : term;
        return c.second_use > 0 ? add(loss, sum(mul(stream, stream))) : loss;
      };
      int handoffs = 0;
      loss_of(autograd::apply<RecordingBiasAdd>({x, b}, &handoffs)[0]).backward();
      EXPECT_EQ(handoffs, c.handoffs);
      const Tensor x_ref = x.detach().set_requires_grad(true), b_ref = b.detach().set_requires_grad(true);
      const Tensor w_grad = w.grad().clone();
      loss_of(add(x_ref, b_ref)).backward();
      EXPECT_LE(max_abs_difference(x.grad(), x_ref.grad()), 1e-12);
      EXPECT_LE(max_abs_difference(b.grad(), b_ref.grad()), 1e-12);
      EXPECT_LE(max_abs_difference(scale(w_grad, 2.0), w.grad()), 1e-12) << "the norm's own gradients unchanged";
    }
  }
}

// The linear's side: GPT's output projection (linear_add) before a norm takes its bias gradient from
// the norm's backward, with the gradients the finite differences give; under a deferral of the
// weight gradients (DeferWeightGradients) it declines, and every gradient is bitwise the same.
TEST(FusedOps, LinearTakesItsBiasGradientFromTheNormAfterIt) {
  auto block = [](const std::vector<Tensor>& in) {
    // in: x, w, b, residual, norm weight, norm bias
    // The norm first, so that the stream's later uses run their backwards before its own (the
    // engine runs the most recently created ready node first): their gradient is then taken by the
    // norm, whose grad_x is all the linear receives.
    const Tensor stream = linear_add(in[0], in[1], in[2], in[3]);
    const Tensor normalized = layer_norm(stream, in[4], in[5]);
    const Tensor squashed = tanh(stream);
    const Tensor squared = mul(stream, stream);
    return add(mul(normalized, squashed), squared);
  };
  const std::vector<Tensor> inputs = {random_leaf({2, 3, 4}, 65), random_leaf({5, 4}, 66), random_leaf({5}, 67),
                                      random_leaf({2, 3, 5}, 68), random_leaf({5}, 69), random_leaf({5}, 70)};
  expect_gradients_match(block, inputs);
  auto gradients = [&](bool deferred) {
    std::vector<Tensor> leaves;
    for (const Tensor& input : inputs) leaves.push_back(input.detach().set_requires_grad(true));
    const Tensor loss = sum(block(leaves));
    autograd::DeferredWeightGradients weight_work;
    const int64_t before = bias_gradient_handoff_count.load();
    {
      std::optional<autograd::DeferWeightGradients> defer;
      if (deferred) defer.emplace(weight_work);
      loss.backward();
    }
    EXPECT_EQ(bias_gradient_handoff_count.load() - before, deferred ? 0 : 1);
    if (deferred) weight_work.run();
    std::vector<Tensor> result;
    for (const Tensor& leaf : leaves) result.push_back(leaf.grad());
    return result;
  };
  const std::vector<Tensor> now = gradients(false), later = gradients(true);
  for (size_t i = 0; i < now.size(); ++i) {
    ASSERT_TRUE(later[i].defined()) << i;
    EXPECT_EQ(later[i].to_vector(), now[i].to_vector()) << "gradient " << i;
  }
}

// The fused residual add and norm: its sum's gradient is all that the residual's producer receives
// (GPT's attention output projection), so the linear that made the residual takes its bias gradient
// from the norm's backward; not where the residual has a later use, nor when x and residual are one
// tensor. Gradients by finite differences either way.
TEST(FusedOps, AddNormHandsTheResidualsProducerItsBiasGradient) {
  struct Case {
    const char* name;
    bool later_use;     // the linear's output is also used after the norm
    bool same_tensor;   // x and residual are both the linear's output
    int64_t handoffs;
  };
  for (const bool rms : {false, true}) {
    for (const Case& c : {Case{"one use", false, false, 1}, Case{"a later use", true, false, 0},
                          Case{"x and residual one tensor", false, true, 0}}) {
      SCOPED_TRACE(std::string(rms ? "add_rms_norm, " : "add_layer_norm, ") + c.name);
      auto block = [&](const std::vector<Tensor>& in) {
        // in: x, residual stream, w, b, norm weight, norm bias
        const Tensor projected = linear(in[0], in[2], in[3]);
        const Tensor& stream = c.same_tensor ? projected : in[1];
        auto [summed, normalized] = rms ? add_rms_norm(stream, projected, in[4])
                                        : add_layer_norm(stream, projected, in[4], in[5]);
        Tensor out = add(mul(normalized, tanh(summed)), mul(summed, summed));
        if (rms) out = add(out, mul(normalized, in[5]));  // every input takes part
        if (c.same_tensor) out = add(out, in[1]);
        return c.later_use ? add(out, mul(projected, projected)) : out;
      };
      const std::vector<Tensor> inputs = {random_leaf({2, 3, 4}, 71), random_leaf({2, 3, 5}, 72),
                                          random_leaf({5, 4}, 73),    random_leaf({5}, 74),
                                          random_leaf({5}, 75),       random_leaf({5}, 76)};
      const int64_t before = bias_gradient_handoff_count.load();
      std::vector<Tensor> leaves;
      for (const Tensor& input : inputs) leaves.push_back(input.detach().set_requires_grad(true));
      sum(block(leaves)).backward();
      EXPECT_EQ(bias_gradient_handoff_count.load() - before, c.handoffs);
      expect_gradients_match(block, inputs);
    }
  }
}

// The step builder's cut between two GPT blocks: the MLP output projection (linear_add) ends the
// segment below and the next block's first norm begins the one above, on the projection's detached
// output, a residual stream (the norm takes the later uses' gradient). Given the projection's output
// as the leaf's producer (autograd::backward_to_inputs), the norm's backward sums the columns for it
// (one hand-off) and the projection's backward, run next from what reached the leaf, uses them,
// with or without a deferral of its weight gradients; every gradient is bitwise that of the cut
// without the producer, and that of the uncut function, whose gradients the finite differences check.
TEST(FusedOps, NormHandsTheBiasGradientAcrossASegmentCut) {
  // in: x, w, b, residual, norm weight, norm bias
  const std::vector<Tensor> inputs = {random_leaf({2, 3, 4}, 80), random_leaf({5, 4}, 81), random_leaf({5}, 82),
                                      random_leaf({2, 3, 5}, 83), random_leaf({5}, 84), random_leaf({5}, 85)};
  // The part above the cut, its ops created in this order: the norm first, so that the later uses'
  // backwards run before its own (the engine runs the most recently created ready node first).
  auto above = [](const Tensor& stream, const Tensor& norm_weight, const Tensor& norm_bias) {
    const Tensor normalized = layer_norm(stream, norm_weight, norm_bias);
    const Tensor squashed = tanh(stream);
    const Tensor squared = mul(stream, stream);
    return sum(add(mul(normalized, squashed), squared));
  };
  auto uncut = [&](const std::vector<Tensor>& in) {
    return above(linear_add(in[0], in[1], in[2], in[3]), in[4], in[5]);
  };
  expect_gradients_match(uncut, inputs);
  auto leaves_of = [&] {
    std::vector<Tensor> leaves;
    for (const Tensor& input : inputs) leaves.push_back(input.detach().set_requires_grad(true));
    return leaves;
  };
  std::vector<Tensor> reference;
  {
    const std::vector<Tensor> leaves = leaves_of();
    uncut(leaves).backward();
    for (const Tensor& leaf : leaves) reference.push_back(leaf.grad());
  }
  std::vector<double> first_bias_gradient;
  for (const bool with_producer : {false, true}) {
    for (const bool deferred : {false, true}) {
      SCOPED_TRACE(std::string(with_producer ? "with the producer" : "without") + (deferred ? ", deferred" : ""));
      const std::vector<Tensor> leaves = leaves_of();
      const Tensor stream = linear_add(leaves[0], leaves[1], leaves[2], leaves[3]);  // the segment below
      const Tensor stream_leaf = stream.detach().set_requires_grad(true);
      const Tensor loss = above(stream_leaf, leaves[4], leaves[5]);
      const int64_t before = bias_gradient_handoff_count.load();
      const std::vector<Tensor> reached = autograd::backward_to_inputs(
          {loss}, {Tensor()}, {stream_leaf}, with_producer ? std::vector<Tensor>{stream} : std::vector<Tensor>{});
      EXPECT_EQ(bias_gradient_handoff_count.load() - before, with_producer ? 1 : 0);
      autograd::DeferredWeightGradients weight_work;
      {
        std::optional<autograd::DeferWeightGradients> defer;
        if (deferred) defer.emplace(weight_work);
        autograd::backward_to_inputs({stream}, {reached[0]}, {});
      }
      if (deferred) {
        EXPECT_FALSE(leaves[2].grad().defined()) << "the bias gradient waits with the weight's";
        weight_work.run();
      }
      for (size_t i = 0; i < leaves.size(); ++i) {
        ASSERT_TRUE(leaves[i].grad().defined()) << i;
        EXPECT_LE(max_abs_difference(leaves[i].grad(), reference[i]), 1e-12) << "gradient " << i;
      }
      if (first_bias_gradient.empty()) first_bias_gradient = leaves[2].grad().to_vector();
      EXPECT_EQ(leaves[2].grad().to_vector(), first_bias_gradient) << "the bias gradient, bitwise";
    }
  }
}

TEST(FusedOps, AddLayerNormRejectsMismatchedResidual) {
  Tensor x = random_leaf({2, 7}, 12), w = random_leaf({7}, 13);
  EXPECT_THROW(add_layer_norm(x, random_leaf({1, 7}, 14), w, Tensor()), Error);
  EXPECT_THROW(add_layer_norm(x, random_leaf({2, 7}, 15).to(kFloat32), w, Tensor()), Error);
}

TEST(FusedOps, LinearGeluForwardEqualsGeluOfLinear) {
  Tensor x = random_leaf({2, 3, 4}, 20), w = random_leaf({6, 4}, 21), b = random_leaf({6}, 22);
  const Tensor out = linear_gelu(x, w, b);
  ASSERT_EQ(out.shape(), Shape({2, 3, 6}));
  EXPECT_LE(max_abs_difference(out, gelu(linear(x, w, b))), 1e-12);
  EXPECT_LE(max_abs_difference(linear_gelu(x, w, Tensor()), gelu(linear(x, w))), 1e-12);
  Tensor v = random_leaf({4}, 23);
  EXPECT_LE(max_abs_difference(linear_gelu(v, w, b), gelu(linear(v, w, b))), 1e-12);
  EXPECT_EQ(linear_gelu(v, w, b).shape(), Shape({6}));
}

TEST(FusedOps, LinearGeluGradients) {
  Tensor x = random_leaf({2, 3, 4}, 24), w = random_leaf({6, 4}, 25), b = random_leaf({6}, 26);
  expect_gradients_match([](const std::vector<Tensor>& in) { return linear_gelu(in[0], in[1], in[2]); }, {x, w, b});
  expect_gradients_match([](const std::vector<Tensor>& in) { return linear_gelu(in[0], in[1], Tensor()); }, {x, w});
  Tensor v = random_leaf({4}, 27);
  expect_gradients_match([](const std::vector<Tensor>& in) { return linear_gelu(in[0], in[1], in[2]); }, {v, w, b});
  // Transposed input view.
  Tensor xt = random_leaf({4, 5}, 28);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear_gelu(in[0].transpose(0, 1), in[1], in[2]); }, {xt, w, b});
}

// Backend::matmul_and_column_sums on the CPU (the default every backend falls back to): the product
// (or GELU's backward product) and the column sums of a, bit for bit what the two apart compute, in
// f32 and bf16 (where rounding would show another order of work).
TEST(FusedOps, MatmulAndColumnSumsEqualsTheProductAndTheSumsApart) {
  Backend& backend = backend_for(Device::cpu());
  for (const DType dtype : {kFloat32, kBFloat16}) {
    const Tensor a = random_leaf({1, 37, 24}, 40, false).to(dtype);     // dY [1, M, K]
    const Tensor bm = random_leaf({1, 24, 16}, 41, false).to(dtype);    // W [1, K, N]
    const Tensor pre = random_leaf({1, 37, 16}, 42, false).to(dtype);   // a GELU linear's pre-activation
    for (const bool gelu : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (gelu ? " with gelu'" : " plain"));
      const Tensor out = Tensor::empty({1, 37, 16}, dtype), sums = Tensor::empty({24}, dtype);
      backend.matmul_and_column_sums(a, bm, gelu ? pre : Tensor(), out, sums);
      const Tensor expected_out = Tensor::empty({1, 37, 16}, dtype);
      if (gelu) {
        backend.matmul_gelu_backward(a, bm, pre, expected_out);
      } else {
        backend.matmul(a, bm, expected_out, 1.0, 0.0);
      }
      EXPECT_EQ(max_abs_difference(out, expected_out), 0.0);
      EXPECT_EQ(max_abs_difference(sums, sum_to_shape(a.view({37, 24}), {24})), 0.0);
      // And the sums are the column sums (to the dtype's rounding).
      const Tensor column_sums = sum_to_shape(a.to(kFloat64).view({37, 24}), {24});
      EXPECT_LE(max_abs_difference(sums.to(kFloat64), column_sums), dtype == kFloat32 ? 1e-5 : 0.1);
    }
  }
}

// linear's bias gradient comes with dX's product (Backend::matmul_and_column_sums) where nothing
// defers it: the column sums of dY, for a plain linear and for an MLP whose projection hands the GELU
// linear dPre (each bias gradient then the column sums of that linear's own dY).
TEST(FusedOps, LinearBiasGradientIsTheColumnSumsOfItsOutputGradient) {
  Tensor x = random_leaf({2, 5, 4}, 43), w = random_leaf({6, 4}, 44), b = random_leaf({6}, 45);
  const Tensor g = random_leaf({2, 5, 6}, 46, false);
  linear(x, w, b).backward(g);
  EXPECT_EQ(max_abs_difference(b.grad(), sum_to_shape(g, {6})), 0.0);

  Tensor w2 = random_leaf({3, 6}, 47), b2 = random_leaf({3}, 48);
  Tensor x2 = random_leaf({2, 5, 4}, 49), b1 = random_leaf({6}, 50), w1 = random_leaf({6, 4}, 51);
  const Tensor g2 = random_leaf({2, 5, 3}, 52, false);
  const Tensor hidden = linear_gelu(x2, w1, b1);
  linear(hidden, w2, b2).backward(g2);
  EXPECT_EQ(max_abs_difference(b2.grad(), sum_to_shape(g2, {3})), 0.0);
  // The GELU linear's dY is dPre = gelu'(pre) * (g2 W2): its bias gradient is that's column sums.
  const Tensor pre = linear(x2.detach(), w1.detach(), b1.detach());
  const Tensor grad_hidden = matmul(g2, w2.detach());
  const Tensor grad_pre = Tensor::empty(pre.shape(), pre.dtype());
  backend_for(Device::cpu()).unary_backward(UnaryOp::kGelu, pre, grad_hidden, grad_pre);
  EXPECT_LE(max_abs_difference(b1.grad(), sum_to_shape(grad_pre, {6})), 1e-12);
}

TEST(FusedOps, LinearGeluRejectsBadShapes) {
  Tensor x = random_leaf({2, 4}, 29), w = random_leaf({6, 4}, 30);
  EXPECT_THROW(linear_gelu(x, w, random_leaf({5}, 31)), Error);
  EXPECT_THROW(linear_gelu(random_leaf({2, 5}, 32), w, random_leaf({6}, 33)), Error);
}

// A LayerNorm of another type: TransformerBlock then takes the unfused path (add, then norm2).
class UnfusedLayerNorm final : public LayerNorm {
 public:
  using LayerNorm::LayerNorm;
};

WEFT_REGISTER_LAYER("unfused_layer_norm_for_test", [](const LayerContext& context) {
  return std::make_shared<UnfusedLayerNorm>(context.config.dim, context.config.norm_eps, context.config.bias);
});

// An RmsNorm of another type, likewise.
class UnfusedRmsNorm final : public RmsNorm {
 public:
  using RmsNorm::RmsNorm;
};

WEFT_REGISTER_LAYER("unfused_rms_norm_for_test", [](const LayerContext& context) {
  return std::make_shared<UnfusedRmsNorm>(context.config.dim, context.config.norm_eps);
});

// The block with add_layer_norm (add_rms_norm) gives the unfused block's output and gradients (f64,
// same weights).
TEST(FusedOps, TransformerBlockMatchesTheUnfusedBlock) {
  for (int variant = 0; variant < 3; ++variant) {
    const bool bias = variant == 0, rms = variant == 2;
    ModelConfig config = testing::small_model_config();
    config.bias = bias;
    if (rms) config.norm = "rms_norm";
    ModelConfig unfused_config = config;
    unfused_config.norm = rms ? "unfused_rms_norm_for_test" : "unfused_layer_norm_for_test";
    uint64_t offset = 0, unfused_offset = 0;
    TransformerBlock fused(LayerContext{config, &offset});
    TransformerBlock unfused(LayerContext{unfused_config, &unfused_offset});
    fused.to(kFloat64);
    unfused.to(kFloat64);
    std::map<std::string, Tensor> state;
    uint64_t noise_offset = 0;
    for (const NamedParameter& entry : fused.named_parameters()) {
      const Tensor noise = Tensor::normal(entry.tensor.shape(), 77, noise_offset, 0.0, 0.3, kFloat64);
      noise_offset += static_cast<uint64_t>(entry.tensor.numel());
      state.emplace(entry.name, add(entry.tensor.detach(), noise));
    }
    fused.load_state_dict(state);
    unfused.load_state_dict(state);

    const Tensor x = random_leaf({2, 5, 8}, 78), x_unfused = random_leaf({2, 5, 8}, 78);
    const Tensor y = fused.forward(x);
    const Tensor y_unfused = unfused.forward(x_unfused);
    EXPECT_LE(max_abs_difference(y, y_unfused), 1e-12);
    const Tensor weights = random_leaf({2, 5, 8}, 79, false);
    // With biases, the attention output projection takes its bias gradient from add_layer_norm's
    // backward (bias_gradient_handoff.h); the unfused block's add in between keeps it from that.
    const int64_t before = bias_gradient_handoff_count.load();
    sum(mul(y, weights)).backward();
    EXPECT_EQ(bias_gradient_handoff_count.load() - before, bias ? 1 : 0);
    sum(mul(y_unfused, weights)).backward();
    EXPECT_EQ(bias_gradient_handoff_count.load() - before, bias ? 1 : 0);
    EXPECT_LE(max_abs_difference(x.grad(), x_unfused.grad()), 1e-12);
    const auto fused_parameters = fused.named_parameters();
    const auto unfused_parameters = unfused.named_parameters();
    ASSERT_EQ(fused_parameters.size(), unfused_parameters.size());
    for (size_t i = 0; i < fused_parameters.size(); ++i) {
      ASSERT_TRUE(fused_parameters[i].tensor.grad().defined()) << fused_parameters[i].name;
      EXPECT_LE(max_abs_difference(fused_parameters[i].tensor.grad(), unfused_parameters[i].tensor.grad()), 1e-12)
          << fused_parameters[i].name;
    }
  }
}

}  // namespace
}  // namespace weft
