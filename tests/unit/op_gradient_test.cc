// Backward of every differentiable op against central finite differences in double precision,
// on odd sizes, non-contiguous views and broadcasts.
#include <cmath>

#include "gtest/gtest.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using testing::expect_gradients_match;
using testing::random_leaf;
using testing::relative_error;

TEST(OpGradient, BinaryOpsWithBroadcasting) {
  for (auto op : {add, sub, mul, div}) {
    Tensor a = random_leaf({3, 1, 5}, 1);
    Tensor b = random_leaf({4, 1}, 2);
    expect_gradients_match([&](const std::vector<Tensor>& in) { return op(in[0], add_scalar(square(in[1]), 0.5)); },
                           {a, b});
  }
}

TEST(OpGradient, UnaryOps) {
  for (auto op : {relu, gelu, silu, exp, tanh, square}) {
    expect_gradients_match([&](const std::vector<Tensor>& in) { return op(in[0]); }, {random_leaf({7, 3}, 3)});
  }
  // log and sqrt on positive inputs.
  expect_gradients_match([](const std::vector<Tensor>& in) { return log(add_scalar(square(in[0]), 0.5)); },
                         {random_leaf({5}, 4)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return sqrt(add_scalar(square(in[0]), 0.5)); },
                         {random_leaf({5}, 5)});
}

TEST(OpGradient, Reductions) {
  Tensor x = random_leaf({3, 4, 5}, 6);
  expect_gradients_match([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return mean(in[0], {-1}, true); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return mean(in[0]); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return max(in[0], 1).first; }, {x});
}

TEST(OpGradient, ViewsAndCopies) {
  Tensor x = random_leaf({4, 6}, 7);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0].transpose(0, 1).narrow(0, 1, 4);  // [4, 4], non-contiguous
        return mul(t.reshape({2, 8}), t.contiguous().view({2, 8}).expand({3, 2, 8}));
      },
      {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].slice(1, -3, 6).to(kFloat32).to(kFloat64); },
                         {x}, {.step = 1e-2, .absolute_tolerance = 1e-3});
}

TEST(OpGradient, MatmulShapes) {
  // Plain, transposed operands, broadcast batch, shared 2-D right operand.
  Tensor a = random_leaf({5, 3}, 8), b = random_leaf({3, 7}, 9);
  expect_gradients_match([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b});
  Tensor at = random_leaf({3, 5}, 10), bt = random_leaf({7, 3}, 11);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return matmul(in[0].transpose(0, 1), in[1].transpose(0, 1)); }, {at, bt});
  Tensor batched = random_leaf({2, 1, 4, 3}, 12), right = random_leaf({3, 3, 5}, 13);
  expect_gradients_match([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {batched, right});
  Tensor x = random_leaf({2, 3, 4}, 14), w = random_leaf({6, 4}, 15), bias = random_leaf({6}, 16);
  expect_gradients_match([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, bias});
}

TEST(OpGradient, GeluMlpWithOneAndTwoUsesOfTheHidden) {
  // A linear after linear_gelu hands it the gradient of its pre-activation when it is the hidden
  // activation's one use, and not when there is a second (whose gradient must go through gelu' too).
  Tensor x = random_leaf({2, 3, 4}, 40), w1 = random_leaf({8, 4}, 41), b1 = random_leaf({8}, 42);
  Tensor w2 = random_leaf({5, 8}, 43), b2 = random_leaf({5}, 44);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear(linear_gelu(in[0], in[1], in[2]), in[3], in[4]); },
      {x, w1, b1, w2, b2});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        const Tensor hidden = linear_gelu(in[0], in[1], in[2]);  // [2, 3, 8]
        return add(linear(hidden, in[3], in[4]), hidden.narrow(2, 0, 5));
      },
      {x, w1, b1, w2, b2});
}

TEST(OpGradient, SoftmaxAndLogSoftmax) {
  Tensor x = random_leaf({3, 5, 4}, 17);
  expect_gradients_match([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {x});
}

TEST(OpGradient, Normalization) {
  Tensor x = random_leaf({2, 3, 7}, 18), w = random_leaf({7}, 19), b = random_leaf({7}, 20);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, w, b});
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], Tensor()); }, {x, w});
  expect_gradients_match([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, w});
}

TEST(OpGradient, EmbeddingWithRepeatedIds) {
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 0, 3, 4, 1, 3}, {2, 3});
  Tensor weight = random_leaf({5, 4}, 21);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return embedding(ids, in[0]); }, {weight});
}

TEST(OpGradient, CausalAttention) {
  Tensor q = random_leaf({2, 2, 5, 3}, 22), k = random_leaf({2, 2, 5, 3}, 23), v = random_leaf({2, 2, 5, 3}, 24);
  expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2]); },
                         {q, k, v});
}

// Grouped-query attention: k, v with KV heads (H % KV == 0), query head h reading kv head h / (H / KV);
// k's and v's gradients sum over each group. Group 2 and multi-query (KV = 1), with odd sizes.
TEST(OpGradient, CausalAttentionGroupedQuery) {
  for (const int64_t kv_heads : {2, 1}) {
    Tensor q = random_leaf({2, 4, 5, 3}, 30), k = random_leaf({2, kv_heads, 5, 3}, 31),
           v = random_leaf({2, kv_heads, 5, 3}, 32);
    expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2]); },
                           {q, k, v});
  }
}

// The same as multi-head attention on k, v expanded to H heads (what layers/attention.cc did before
// the backends took kv heads): outputs equal and, through the expand's backward, every gradient.
TEST(OpGradient, CausalAttentionGroupedQueryEqualsExpandedHeads) {
  const int64_t batch = 2, heads = 6, kv_heads = 2, steps = 7, dim = 5;
  const auto expand_heads = [&](const Tensor& t) {  // [B, KV, T, D] -> [B, H, T, D]
    return t.unsqueeze(2).expand({batch, kv_heads, heads / kv_heads, steps, dim}).reshape({batch, heads, steps, dim});
  };
  const Tensor weights = random_leaf({batch, heads, steps, dim}, 33, false);
  std::vector<Tensor> grouped_grads, expanded_grads;
  Tensor grouped_out, expanded_out;
  for (const bool expand : {false, true}) {
    Tensor q = random_leaf({batch, heads, steps, dim}, 34), k = random_leaf({batch, kv_heads, steps, dim}, 35),
           v = random_leaf({batch, kv_heads, steps, dim}, 36);
    const Tensor out = expand ? causal_attention(q, expand_heads(k), expand_heads(v)) : causal_attention(q, k, v);
    sum(mul(out, weights)).backward();
    (expand ? expanded_out : grouped_out) = out;
    (expand ? expanded_grads : grouped_grads) = {q.grad(), k.grad(), v.grad()};
  }
  EXPECT_LT(relative_error(grouped_out, expanded_out), 1e-14);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(grouped_grads[i].shape(), expanded_grads[i].shape()) << "input " << i;
    EXPECT_LT(relative_error(grouped_grads[i], expanded_grads[i]), 1e-13) << "input " << i;
  }
}

// Head dims with no special meaning on the CPU (1, and wider than any CUDA tile): the CPU kernel
// takes any D.
TEST(OpGradient, CausalAttentionAnyHeadDim) {
  for (const int64_t dim : {1, 17}) {
    Tensor q = random_leaf({1, 2, 4, dim}, 37), k = random_leaf({1, 1, 4, dim}, 38), v = random_leaf({1, 1, 4, dim}, 39);
    expect_gradients_match([](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2]); },
                           {q, k, v});
  }
}

// As the layer calls it: q, k, v are the heads of one projection (strided views the backend reads in
// place) and the output's heads are merged back by a view.
TEST(OpGradient, CausalAttentionOnViewsOfOneProjection) {
  Tensor qkv = random_leaf({2, 5, 3 * 2 * 3}, 27);  // [B, T, 3 * H * D], H = 2, D = 3
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        const auto part = [&](int64_t index) {
          return in[0].narrow(2, index * 6, 6).reshape({2, 5, 2, 3}).permute({0, 2, 1, 3});
        };
        const Tensor out = causal_attention(part(0), part(1), part(2));  // [B, H, T, D]
        return out.permute({0, 2, 1, 3}).reshape({2, 5, 6});
      },
      {qkv});
}

TEST(OpGradient, CrossEntropyWithIgnoredRows) {
  Tensor logits = random_leaf({5, 7}, 25);
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{2, -100, 6, 0, -100}, {5});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets); }, {logits});
}

// An identity whose backward records where the gradient it receives lives.
class RecordingIdentity final : public autograd::Function {
 public:
  explicit RecordingIdentity(const void** gradient_address) : gradient_address_(gradient_address) {}
  std::string name() const override { return "RecordingIdentityBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {inputs[0].clone()}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    *gradient_address_ = grads[0].raw_data();
    return {grads[0].clone()};
  }

 private:
  const void** gradient_address_;
};

// Cross-entropy's backward writes the logits' gradient over the logits only where nothing can read
// them again, and the gradient is the same either way.
TEST(OpGradient, CrossEntropyOverwritesTheLogitsOnlyWhenNothingElseHoldsThem) {
  Tensor x = random_leaf({6, 9}, 27);
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 8, 3, 3, -100, 5}, {6});
  const void* gradient_address = nullptr;
  const void* logits_address = nullptr;
  // Runs forward and backward; keeps the logits alive through backward when `keep` is set.
  auto gradient_of_x = [&](bool keep, bool retain_graph) {
    x.zero_grad();
    Tensor logits = autograd::apply<RecordingIdentity>({x}, &gradient_address)[0];  // [6, 9]
    logits_address = logits.raw_data();
    const Tensor loss = cross_entropy(logits, targets);
    if (!keep) logits = Tensor();
    loss.backward(Tensor(), retain_graph);
    const std::vector<double> gradient = x.grad().to_vector();
    if (retain_graph) {  // a second backward through the kept graph must see the logits unchanged
      const void* first_address = gradient_address;
      x.zero_grad();
      loss.backward();
      EXPECT_EQ(x.grad().to_vector(), gradient);
      gradient_address = first_address;
    }
    return gradient;
  };
  const std::vector<double> in_place = gradient_of_x(false, false);
  EXPECT_EQ(gradient_address, logits_address) << "the gradient did not reuse the freed logits";
  const std::vector<double> kept = gradient_of_x(true, false);
  EXPECT_NE(gradient_address, logits_address) << "the gradient overwrote logits that a tensor still holds";
  EXPECT_EQ(kept, in_place);
  const std::vector<double> retained = gradient_of_x(false, true);
  EXPECT_NE(gradient_address, logits_address) << "the gradient overwrote logits of a retained graph";
  EXPECT_EQ(retained, in_place);
  // And the in-place gradient is the right one: finite differences through the same path.
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        return cross_entropy(autograd::apply<RecordingIdentity>({in[0]}, &gradient_address)[0], targets);
      },
      {x});
}

// The training form: the gradient computed in the forward pass over the logits. Same loss and,
// for the expected seed, bitwise the gradient of cross_entropy's backward (f32 and f64, with ignored
// rows, one micro-batch or four under a scale); another seed (or a second backward of a retained
// graph) still gets the right gradient; without a backward to come the logits are left alone.
TEST(OpGradient, CrossEntropyOverwritingLogitsMatchesForwardThenBackward) {
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 8, 3, 3, -100, 5}, {6});
  for (const DType dtype : {kFloat32, kFloat64}) {
    for (const int micro_batches : {1, 4}) {
      const double seed = 1.0 / micro_batches;
      const auto loss_and_gradient = [&](bool fused) {
        Tensor x = random_leaf({6, 9}, 29).to(dtype).detach();
        x.set_requires_grad(true);
        const Tensor logits = mul(x, Tensor::full({1}, 1.5, dtype));  // not a leaf, as a head's output
        Tensor loss = fused ? cross_entropy_overwriting_logits(logits, targets, -100, 5, seed)
                            : cross_entropy(logits, targets, -100, 5);
        if (micro_batches > 1) loss = scale(loss, seed);
        loss.backward();
        return std::make_pair(loss.item(), x.grad().to_vector());
      };
      const auto [fused_loss, fused_gradient] = loss_and_gradient(true);
      const auto [loss, gradient] = loss_and_gradient(false);
      EXPECT_EQ(fused_loss, loss) << dtype_name(dtype) << " micro-batches " << micro_batches;
      EXPECT_EQ(fused_gradient, gradient) << dtype_name(dtype) << " micro-batches " << micro_batches;
    }
  }
  // A seed other than the expected one: the gradient is rescaled, against finite differences.
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        return scale(cross_entropy_overwriting_logits(mul(in[0], in[0]), targets, -100, 5, 0.25), 3.0);
      },
      {random_leaf({6, 9}, 30)});
  // A retained graph: the second backward gets the same gradient as the first.
  Tensor x = random_leaf({6, 9}, 31);
  const Tensor loss = scale(cross_entropy_overwriting_logits(mul(x, x), targets, -100, 5, 1.0), 2.0);
  loss.backward(Tensor(), /*retain_graph=*/true);
  const std::vector<double> first = x.grad().to_vector();
  x.zero_grad();
  loss.backward();
  EXPECT_EQ(x.grad().to_vector(), first);
  // The logits hold the gradient afterwards; without grad mode they keep their values.
  const Tensor logits = mul(x, x);
  const std::vector<double> values = logits.to_vector();
  cross_entropy_overwriting_logits(logits, targets, -100, 5, 1.0);
  EXPECT_NE(logits.to_vector(), values);
  {
    autograd::NoGradGuard no_grad;
    const Tensor plain = mul(x, x);
    const double value = cross_entropy_overwriting_logits(plain, targets, -100, 5, 1.0).item();
    EXPECT_EQ(plain.to_vector(), values);
    EXPECT_EQ(value, cross_entropy(plain, targets, -100, 5).item());
  }
  EXPECT_THROW(cross_entropy_overwriting_logits(mul(x, x), targets, -100, -1, 1.0), Error);
}

TEST(OpGradient, DropoutUsesTheSameMaskBackward) {
  Tensor x = random_leaf({4, 9}, 26);
  expect_gradients_match([](const std::vector<Tensor>& in) { return dropout(in[0], 0.3, 99, 5); }, {x});
}

TEST(OpGradient, ConcatAndSplit) {
  Tensor a = random_leaf({2, 3}, 27), b = random_leaf({2, 4}, 28);
  expect_gradients_match([](const std::vector<Tensor>& in) { return concat({in[0], in[1]}, 1); }, {a, b});
  Tensor x = random_leaf({9, 2}, 29);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> pieces = split(in[0], {2, 3, 4}, 0);
        return concat({pieces[2], scale(pieces[0], 3.0)}, 0);  // the middle piece gets no gradient
      },
      {x});
}

}  // namespace
}  // namespace weft
