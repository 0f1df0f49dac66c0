// Llama's fused ops on the CPU (the reference backend): rotary_embedding (runtime/ops/rotary.h),
// swiglu (runtime/ops/swiglu.h) and swiglu_linear (runtime/ops/swiglu_linear.h: gate and up
// products with the activation, its weight gradients in one product where their .grad are
// adjacent). Forward and backward equal the unfused compositions they
// replace bit for bit in f32 and f64 (split/neg/concat/mul/add for the rotation; silu then mul);
// 16-bit dtypes equal the f32 result rounded once; gradients match central finite differences in
// f64, also for tables whose halves differ (the backward is the transpose, not only the inverse
// rotation); the rotation's output keeps the [B, T, H, D] memory of a projection's heads; attention
// un-rotating its q and k gradients in place (unrotate_gradient_in_place) gives the same gradients
// and hands the qkv projection one gradient buffer; a SwiGLU MLP's down-projection hands
// swiglu_linear its gate and up gradients (swiglu_gradient_handoff.h) only as the output's one use;
// bad arguments are weft::Error.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "layers/rope.h"
#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/autograd/function.h"
#include "runtime/ops/swiglu_gradient_handoff.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using testing::expect_gradients_match;
using testing::max_abs_difference;
using testing::random_leaf;

// What layers/rope.cc computed before the fused op: x * cos + rotate_half(x) * sin.
Tensor unfused_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t half = x.size(3) / 2;
  const std::vector<Tensor> halves = split(x, {half, half}, -1);  // 2 x [B, H, T, D/2]
  return add(mul(x, cos), mul(concat({neg(halves[1]), halves[0]}, -1), sin));
}

Tensor unfused_swiglu(const Tensor& gate, const Tensor& up) { return mul(silu(gate), up); }

// A leaf of `dtype` with the values of random_leaf(shape, seed) rounded to it.
Tensor leaf_of(absl::Span<const int64_t> shape, uint64_t seed, DType dtype, bool requires_grad = true) {
  return random_leaf(shape, seed, false).to(dtype).set_requires_grad(requires_grad);
}

// The heads of a [B, T, H, D] projection seen as [B, H, T, D], as the attention layer makes q and k.
Tensor heads_view(const Tensor& projection) { return projection.permute({0, 2, 1, 3}); }

constexpr int64_t kB = 2, kH = 3, kT = 5, kD = 8;

TEST(RotaryEmbedding, EqualsTheUnfusedOpsBitForBit) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto [cos64, sin64] = rotary_tables(kT, kD, 10000.0);
    const Tensor cos = cos64.to(dtype), sin = sin64.to(dtype);
    for (bool projection_layout : {true, false}) {
      const Tensor x = projection_layout ? leaf_of({kB, kT, kH, kD}, 1, dtype) : leaf_of({kB, kH, kT, kD}, 1, dtype);
      const Tensor x_unfused = x.detach().set_requires_grad(true);
      const auto input = [&](const Tensor& leaf) { return projection_layout ? heads_view(leaf) : leaf; };
      const Tensor y = rotary_embedding(input(x), cos, sin);
      const Tensor y_unfused = unfused_rotary(input(x_unfused), cos, sin);
      ASSERT_EQ(y.shape(), Shape({kB, kH, kT, kD}));
      EXPECT_EQ(y.to_vector(), y_unfused.to_vector());
      const Tensor weights = leaf_of({kB, kH, kT, kD}, 2, dtype, false);
      sum(mul(y, weights)).backward();
      sum(mul(y_unfused, weights)).backward();
      EXPECT_EQ(x.grad().to_vector(), x_unfused.grad().to_vector());
    }
  }
}

TEST(RotaryEmbedding, SixteenBitDtypesRoundTheF32ResultOnce) {
  const auto [cos64, sin64] = rotary_tables(kT, kD, 10000.0);
  for (DType dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = leaf_of({kB, kH, kT, kD}, 3, dtype, false);
    const Tensor cos = cos64.to(dtype), sin = sin64.to(dtype);
    const Tensor expected = rotary_embedding(x.to(kFloat32), cos.to(kFloat32), sin.to(kFloat32)).to(dtype);
    EXPECT_EQ(rotary_embedding(x, cos, sin).to_vector(), expected.to_vector());
    const Tensor grad = leaf_of({kB, kH, kT, kD}, 4, dtype, false);
    Tensor grad_x = Tensor::empty(x.shape(), dtype), grad_x_f32 = Tensor::empty(x.shape(), kFloat32);
    backend_for(Device::cpu()).rotary_embedding_backward(grad, cos, sin, grad_x);
    backend_for(Device::cpu()).rotary_embedding_backward(grad.to(kFloat32), cos.to(kFloat32), sin.to(kFloat32),
                                                         grad_x_f32);
    EXPECT_EQ(grad_x.to_vector(), grad_x_f32.to(dtype).to_vector());
  }
}

TEST(RotaryEmbedding, KeepsTheProjectionMemoryOrder) {
  const auto [cos, sin] = rotary_tables(kT, kD, 10000.0);
  // Heads inner to positions in memory ([B, T, H, D]): the result and x's gradient are too, so the
  // attention call and the projection's backward read them without a copy.
  const Tensor x = heads_view(leaf_of({kB, kT, kH, kD}, 5, kFloat64)).detach().set_requires_grad(true);
  const Tensor y = rotary_embedding(x, cos, sin);
  EXPECT_EQ(y.strides(), x.strides());
  EXPECT_TRUE(y.permute({0, 2, 1, 3}).is_contiguous());
  const Tensor grad_y = leaf_of({kB, kH, kT, kD}, 15, kFloat64, false);
  const std::vector<Tensor> grads = autograd::backward_to_inputs({y}, {grad_y}, {x});
  ASSERT_TRUE(grads[0].defined());
  EXPECT_EQ(grads[0].strides(), x.strides());
  // A contiguous [B, H, T, D] input gives a contiguous result.
  const Tensor plain = leaf_of({kB, kH, kT, kD}, 6, kFloat64);
  EXPECT_TRUE(rotary_embedding(plain, cos, sin).is_contiguous());
}

TEST(RotaryEmbedding, GradientsMatchFiniteDifferences) {
  const auto [cos, sin] = rotary_tables(kT, kD, 100.0);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], cos, sin); },
                         {random_leaf({kB, kH, kT, kD}, 7)});
  // Through the heads of a projection, twice (the gradients of two uses add up).
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        const Tensor q = rotary_embedding(heads_view(in[0]), cos, sin);
        return mul(q, rotary_embedding(heads_view(in[0]), cos, sin));
      },
      {random_leaf({kB, kT, kH, kD}, 8)});
  // Tables whose halves differ: the backward must be the transpose of the forward.
  const Tensor any_cos = random_leaf({kT, kD}, 9, false), any_sin = random_leaf({kT, kD}, 10, false);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], any_cos, any_sin); },
                         {random_leaf({kB, kH, kT, kD}, 11)});
  EXPECT_EQ(rotary_embedding(random_leaf({1, 1, kT, kD}, 12), any_cos, any_sin).to_vector(),
            unfused_rotary(random_leaf({1, 1, kT, kD}, 12), any_cos, any_sin).to_vector());
}

// Rotated q and k of one qkv projection into causal attention, as the Llama layer does: attention's
// backward un-rotates their gradients in place and the qkv gradient is right (finite differences,
// also with tables whose halves differ); with a second use of the rotated q the rotary node runs its
// own backward (the handover needs one use) and the gradient is right too.
TEST(RotaryEmbedding, AttentionUnrotatesItsGradientsInPlace) {
  const auto [cos, sin] = rotary_tables(kT, kD, 100.0);
  const Tensor any_cos = random_leaf({kT, kD}, 13, false), any_sin = random_leaf({kT, kD}, 14, false);
  for (const bool second_use : {false, true}) {
    for (const bool any_tables : {false, true}) {
      SCOPED_TRACE(std::string(second_use ? "two uses" : "one use") + (any_tables ? ", any tables" : ""));
      const Tensor& c = any_tables ? any_cos : cos;
      const Tensor& s = any_tables ? any_sin : sin;
      expect_gradients_match(
          [&](const std::vector<Tensor>& in) {
            // in[0]: the projection [B, T, (H + 2 KV) D] with H = 2, KV = 1 (grouped-query).
            const std::vector<Tensor> parts = split(in[0], {2 * kD, kD, kD}, -1);
            const auto heads = [&](const Tensor& part, int64_t count) {
              return part.reshape({kB, kT, count, kD}).permute({0, 2, 1, 3});
            };
            const Tensor q = rotary_embedding(heads(parts[0], 2), c, s);
            const Tensor k = rotary_embedding(heads(parts[1], 1), c, s);
            const Tensor out = causal_attention(q, k, heads(parts[2], 1));
            return second_use ? add(out, mul(q, q)) : out;
          },
          {random_leaf({kB, kT, 4 * kD}, 15)});
    }
  }
}

TEST(RotaryEmbedding, RejectsBadArguments) {
  const auto [cos, sin] = rotary_tables(kT, kD, 10000.0);
  const Tensor x = random_leaf({kB, kH, kT, kD}, 13);
  EXPECT_THROW(rotary_embedding(x.select(0, 0), cos, sin), Error);                      // not 4-D
  EXPECT_THROW(rotary_embedding(x.narrow(3, 0, 7), cos.narrow(1, 0, 7), sin.narrow(1, 0, 7)), Error);  // odd D
  EXPECT_THROW(rotary_embedding(x, cos.narrow(0, 0, kT - 1), sin.narrow(0, 0, kT - 1)), Error);        // too short
  EXPECT_THROW(rotary_embedding(x, cos.to(kFloat32), sin.to(kFloat32)), Error);           // dtype
  EXPECT_THROW(rotary_embedding(x, random_leaf({kT, kD}, 14), sin), Error);               // requires grad
  try {
    rotary_embedding(x, cos.narrow(0, 0, 2), sin.narrow(0, 0, 2));
    FAIL() << "expected weft::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("must be [T, D] = [5, 8]"), std::string::npos) << error.what();
  }
}

TEST(Swiglu, EqualsSiluThenMulBitForBit) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Gate values spread wide, so silu's tails (exp overflowing, underflowing) are covered too.
    const Tensor gate = scale(leaf_of({4, 33}, 20, dtype, false), 8.0).detach().set_requires_grad(true);
    const Tensor up = leaf_of({4, 33}, 21, dtype);
    const Tensor gate_unfused = gate.detach().set_requires_grad(true), up_unfused = up.detach().set_requires_grad(true);
    const Tensor y = swiglu(gate, up);
    const Tensor y_unfused = unfused_swiglu(gate_unfused, up_unfused);
    EXPECT_EQ(y.to_vector(), y_unfused.to_vector());
    const Tensor weights = leaf_of({4, 33}, 22, dtype, false);
    sum(mul(y, weights)).backward();
    sum(mul(y_unfused, weights)).backward();
    EXPECT_EQ(gate.grad().to_vector(), gate_unfused.grad().to_vector());
    EXPECT_EQ(up.grad().to_vector(), up_unfused.grad().to_vector());
  }
}

TEST(Swiglu, SixteenBitDtypesRoundTheF32ResultOnce) {
  for (DType dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor gate = leaf_of({3, 40}, 23, dtype, false), up = leaf_of({3, 40}, 24, dtype, false);
    const Tensor grad = leaf_of({3, 40}, 25, dtype, false);
    const Tensor gate32 = gate.to(kFloat32), up32 = up.to(kFloat32), grad32 = grad.to(kFloat32);
    EXPECT_EQ(swiglu(gate, up).to_vector(), swiglu(gate32, up32).to(dtype).to_vector());
    Backend& cpu = backend_for(Device::cpu());
    Tensor grad_gate = Tensor::empty(gate.shape(), dtype), grad_up = Tensor::empty(gate.shape(), dtype);
    Tensor grad_gate32 = Tensor::empty(gate.shape()), grad_up32 = Tensor::empty(gate.shape());
    cpu.swiglu_backward(gate, up, grad, grad_gate, grad_up);
    cpu.swiglu_backward(gate32, up32, grad32, grad_gate32, grad_up32);
    EXPECT_EQ(grad_gate.to_vector(), grad_gate32.to(dtype).to_vector());
    EXPECT_EQ(grad_up.to_vector(), grad_up32.to(dtype).to_vector());
  }
}

TEST(Swiglu, GradientsMatchFiniteDifferences) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
                         {random_leaf({2, 3, 7}, 26), random_leaf({2, 3, 7}, 27)});
  // Non-contiguous inputs, and one tensor as both gate and up.
  expect_gradients_match([](const std::vector<Tensor>& in) { return swiglu(in[0].transpose(0, 1), in[1]); },
                         {random_leaf({7, 4}, 28), random_leaf({4, 7}, 29)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return swiglu(in[0], in[0]); },
                         {random_leaf({5, 6}, 30)});
}

TEST(Swiglu, RejectsBadArguments) {
  const Tensor gate = random_leaf({2, 6}, 31);
  EXPECT_THROW(swiglu(gate, random_leaf({1, 6}, 32)), Error);              // no broadcasting
  EXPECT_THROW(swiglu(gate, random_leaf({2, 6}, 33).to(kFloat32)), Error);  // dtype
  EXPECT_THROW(swiglu(gate, Tensor::arange(12).view({2, 6})), Error);       // integer
}

// swiglu_linear against the two linears and swiglu it replaces: the forward bit for bit (the same
// products and kernel), the gradients within rounding (dX adds its second product inside the GEMM).
TEST(SwigluLinear, EqualsTwoLinearsAndSwiglu) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = leaf_of({2, 3, 8}, 40, dtype), gate = leaf_of({6, 8}, 41, dtype), up = leaf_of({6, 8}, 42, dtype);
    const Tensor x_ref = x.detach().set_requires_grad(true), gate_ref = gate.detach().set_requires_grad(true),
                 up_ref = up.detach().set_requires_grad(true);
    const Tensor y = swiglu_linear(x, gate, up);
    const Tensor y_ref = swiglu(linear(x_ref, gate_ref), linear(x_ref, up_ref));
    ASSERT_EQ(y.shape(), y_ref.shape());
    EXPECT_EQ(y.to_vector(), y_ref.to_vector());
    const Tensor weights = leaf_of({2, 3, 6}, 43, dtype, false);
    sum(mul(y, weights)).backward();
    sum(mul(y_ref, weights)).backward();
    const double tolerance = dtype == kFloat64 ? 1e-12 : 1e-5;
    EXPECT_LT(max_abs_difference(x.grad(), x_ref.grad()), tolerance);
    // Separate .grad tensors: one product each, as linear computes them.
    EXPECT_EQ(gate.grad().to_vector(), gate_ref.grad().to_vector());
    EXPECT_EQ(up.grad().to_vector(), up_ref.grad().to_vector());
  }
}

TEST(SwigluLinear, GradientsMatchFiniteDifferences) {
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return swiglu_linear(in[0], in[1], in[2]); },
      {random_leaf({2, 3, 5}, 44), random_leaf({7, 5}, 45), random_leaf({7, 5}, 46)});
  // x read again by another op (its gradient arrives in two parts), a 1-D x, and one weight as both.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return add(swiglu_linear(in[0], in[1], in[2]), linear(in[0], in[1])); },
      {random_leaf({4, 5}, 47), random_leaf({3, 5}, 48), random_leaf({3, 5}, 49)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return swiglu_linear(in[0], in[1], in[1]); },
                         {random_leaf({5}, 50), random_leaf({4, 5}, 51)});
}

// Gives gate and up [6, 8] f64 .grad views of one storage, one right after the other (gate's first
// or up's), holding stale values that count as zero, as a gradient buffer's slots do after its lazy
// zeroing; returns the storage [96].
Tensor adjacent_gradient_slots(Tensor& gate, Tensor& up, bool gate_first) {
  Tensor slots = Tensor::full({2 * 6 * 8}, 1e30, kFloat64);  // stale contents, never to be read
  gate.set_grad(slots.narrow(0, gate_first ? 0 : 48, 48).view({6, 8}));
  up.set_grad(slots.narrow(0, gate_first ? 48 : 0, 48).view({6, 8}));
  gate.mark_grad_zero();
  up.mark_grad_zero();
  return slots;
}

// With the two weights' .grad next to each other in one storage (a gradient buffer's slots), in
// either order, the one batched product writes each weight's gradient into its own slot: on a
// buffer of stale values that counts as zero (beta 0), then accumulating a second backward (beta 1).
TEST(SwigluLinear, AdjacentGradientsGetTheirOwnProducts) {
  for (bool gate_first : {false, true}) {
    SCOPED_TRACE(gate_first ? "gate's slot first" : "up's slot first (a gradient buffer's backward order)");
    const Tensor x = leaf_of({3, 4, 8}, 52, kFloat64);
    Tensor gate = leaf_of({6, 8}, 53, kFloat64), up = leaf_of({6, 8}, 54, kFloat64);
    const Tensor gate_ref = gate.detach().set_requires_grad(true), up_ref = up.detach().set_requires_grad(true);
    const Tensor slots = adjacent_gradient_slots(gate, up, gate_first);
    const Tensor weights = leaf_of({3, 4, 6}, 55, kFloat64, false);
    for (int pass = 0; pass < 2; ++pass) {
      sum(mul(swiglu_linear(x, gate, up), weights)).backward();
      sum(mul(swiglu(linear(x, gate_ref), linear(x, up_ref)), weights)).backward();
    }
    EXPECT_LT(max_abs_difference(gate.grad(), gate_ref.grad()), 1e-12);
    EXPECT_LT(max_abs_difference(up.grad(), up_ref.grad()), 1e-12);
    // Still the views of the slots: written in place, not replaced.
    EXPECT_EQ(gate.grad().raw_data(), slots.narrow(0, gate_first ? 0 : 48, 48).raw_data());
    EXPECT_EQ(up.grad().raw_data(), slots.narrow(0, gate_first ? 48 : 0, 48).raw_data());
  }
}

// A SwiGLU MLP: the down-projection's backward hands swiglu_linear its gate and up gradients from
// one Backend::matmul_swiglu_backward (swiglu_gradient_handoff.h). Against the unfused ops (two
// linears, swiglu, the down linear): gradients within rounding, in f32 and f64, and with the gate
// and up .grad adjacent in either order (the hand-off allocates the pair gradient in the slots'
// order, so the one batched product still writes both). Finite differences with the hand-off, and
// with a second use of the SwiGLU output, where it must not be taken.
TEST(SwigluLinear, DownProjectionHandsItsGradientsBack) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = leaf_of({2, 3, 8}, 62, dtype), gate = leaf_of({6, 8}, 63, dtype), up = leaf_of({6, 8}, 64, dtype),
                 down = leaf_of({8, 6}, 65, dtype);
    const Tensor x_ref = x.detach().set_requires_grad(true), gate_ref = gate.detach().set_requires_grad(true),
                 up_ref = up.detach().set_requires_grad(true), down_ref = down.detach().set_requires_grad(true);
    const Tensor weights = leaf_of({2, 3, 8}, 66, dtype, false);
    sum(mul(linear(swiglu_linear(x, gate, up), down), weights)).backward();
    sum(mul(linear(swiglu(linear(x_ref, gate_ref), linear(x_ref, up_ref)), down_ref), weights)).backward();
    const double tolerance = dtype == kFloat64 ? 1e-12 : 1e-5;
    for (const auto& [got, want] : {std::pair{x, x_ref}, {gate, gate_ref}, {up, up_ref}, {down, down_ref}}) {
      EXPECT_LT(max_abs_difference(got.grad(), want.grad()), tolerance);
    }
  }
  for (bool gate_first : {false, true}) {
    SCOPED_TRACE(gate_first ? "gate's slot first" : "up's slot first");
    const Tensor x = leaf_of({3, 4, 8}, 67, kFloat64), down = leaf_of({8, 6}, 68, kFloat64);
    Tensor gate = leaf_of({6, 8}, 69, kFloat64), up = leaf_of({6, 8}, 70, kFloat64);
    const Tensor gate_ref = gate.detach().set_requires_grad(true), up_ref = up.detach().set_requires_grad(true);
    const Tensor slots = adjacent_gradient_slots(gate, up, gate_first);
    const Tensor weights = leaf_of({3, 4, 8}, 71, kFloat64, false);
    sum(mul(linear(swiglu_linear(x, gate, up), down), weights)).backward();
    sum(mul(linear(swiglu(linear(x, gate_ref), linear(x, up_ref)), down), weights)).backward();
    EXPECT_LT(max_abs_difference(gate.grad(), gate_ref.grad()), 1e-12);
    EXPECT_LT(max_abs_difference(up.grad(), up_ref.grad()), 1e-12);
    EXPECT_EQ(gate.grad().raw_data(), slots.narrow(0, gate_first ? 0 : 48, 48).raw_data());
  }
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return linear(swiglu_linear(in[0], in[1], in[2]), in[3]); },
      {random_leaf({2, 3, 5}, 72), random_leaf({7, 5}, 73), random_leaf({7, 5}, 74), random_leaf({4, 7}, 75)});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        const Tensor hidden = swiglu_linear(in[0], in[1], in[2]);
        return add(linear(hidden, in[3]), linear(hidden, in[4]));
      },
      {random_leaf({2, 3, 5}, 76), random_leaf({7, 5}, 77), random_leaf({7, 5}, 78), random_leaf({5, 7}, 79),
       random_leaf({5, 7}, 80)});
}

// The hand-off under a zero-bubble pipeline's split backward (DeferWeightGradients): the input
// gradient at once, the gate, up and down weight gradients at run(), each bitwise what an undeferred
// backward gives (the pair gradient the down linear wrote is the one the deferred product reads).
TEST(SwigluLinear, HandOffKeepsDeferredWeightGradientsExact) {
  auto mlp_gradients = [](bool deferred) {
    const Tensor x = leaf_of({2, 3, 8}, 86, kFloat32), gate = leaf_of({6, 8}, 87, kFloat32),
                 up = leaf_of({6, 8}, 88, kFloat32), down = leaf_of({8, 6}, 89, kFloat32);
    const Tensor loss = sum(mul(linear(swiglu_linear(x, gate, up), down), leaf_of({2, 3, 8}, 90, kFloat32, false)));
    autograd::DeferredWeightGradients weight_work;
    {
      std::optional<autograd::DeferWeightGradients> defer;
      if (deferred) defer.emplace(weight_work);
      loss.backward();
    }
    EXPECT_TRUE(x.grad().defined());
    if (deferred) {
      EXPECT_FALSE(gate.grad().defined()) << "the weight gradients wait for run()";
      weight_work.run();
    }
    return std::vector<Tensor>{x.grad(), gate.grad(), up.grad(), down.grad()};
  };
  const std::vector<Tensor> now = mlp_gradients(false), later = mlp_gradients(true);
  for (size_t i = 0; i < now.size(); ++i) {
    ASSERT_TRUE(later[i].defined()) << i;
    EXPECT_EQ(later[i].to_vector(), now[i].to_vector()) << "gradient " << i;
  }
}

// The linear's side of the hand-off, seen from a producer that records it: asked once where the
// linear is its output's one use, never where the output has a second use; the gradients right
// either way (against silu then mul, within rounding).
class RecordingSwiglu final : public autograd::Function, public SwigluGradientProducer {
 public:
  explicit RecordingSwiglu(int* handoffs) : handoffs_(handoffs) {}
  std::string name() const override { return "RecordingSwigluBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    Tensor out = Tensor::empty(inputs[0].shape(), inputs[0].dtype(), inputs[0].device());
    backend_for(out.device()).swiglu(inputs[0], inputs[1], out);
    save_for_backward({inputs[0], inputs[1]});
    return {out};
  }
  Handoff take_gradients_from_next_product(DType dtype, int64_t rows, int64_t hidden) override {
    ++*handoffs_;
    const Tensor& gate = saved()[0];
    EXPECT_EQ(dtype, gate.dtype());
    EXPECT_EQ(rows, gate.size(0));
    EXPECT_EQ(hidden, gate.size(1));
    grad_gate_ = Tensor::empty(gate.shape(), dtype, gate.device());
    grad_up_ = Tensor::empty(gate.shape(), dtype, gate.device());
    return {gate, saved()[1], grad_gate_, grad_up_};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    if (grad_gate_.defined()) return {std::exchange(grad_gate_, Tensor()), std::exchange(grad_up_, Tensor())};
    const Tensor& gate = saved()[0];
    Tensor grad_gate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    Tensor grad_up = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    backend_for(gate.device()).swiglu_backward(gate, saved()[1], grad_or_zeros(grads, 0).contiguous(), grad_gate,
                                               grad_up);
    return {grad_gate, grad_up};
  }

 private:
  int* handoffs_;
  Tensor grad_gate_, grad_up_;
};

TEST(SwigluLinear, LinearAsksItsProducerOnlyAsItsOneUse) {
  for (bool second_use : {false, true}) {
    SCOPED_TRACE(second_use ? "the output read again" : "the linear the output's one use");
    const Tensor gate = leaf_of({5, 6}, 81, kFloat64), up = leaf_of({5, 6}, 82, kFloat64),
                 down = leaf_of({4, 6}, 83, kFloat64);
    const Tensor gate_ref = gate.detach().set_requires_grad(true), up_ref = up.detach().set_requires_grad(true);
    int handoffs = 0;
    const Tensor hidden = autograd::apply<RecordingSwiglu>({gate, up}, &handoffs)[0];
    const Tensor hidden_ref = mul(silu(gate_ref), up_ref);
    const Tensor out_weights = leaf_of({5, 4}, 84, kFloat64, false);
    const Tensor hidden_weights = leaf_of({5, 6}, 85, kFloat64, false);
    auto loss = [&](const Tensor& h) {
      Tensor value = sum(mul(linear(h, down.detach()), out_weights));
      return second_use ? add(value, sum(mul(h, hidden_weights))) : value;
    };
    loss(hidden).backward();
    loss(hidden_ref).backward();
    EXPECT_EQ(handoffs, second_use ? 0 : 1);
    EXPECT_LT(max_abs_difference(gate.grad(), gate_ref.grad()), 1e-12);
    EXPECT_LT(max_abs_difference(up.grad(), up_ref.grad()), 1e-12);
  }
}

TEST(SwigluLinear, RejectsBadArguments) {
  const Tensor x = random_leaf({2, 5}, 56), weight = random_leaf({4, 5}, 57);
  EXPECT_THROW(swiglu_linear(x, weight, random_leaf({3, 5}, 58)), Error);           // weights of two shapes
  EXPECT_THROW(swiglu_linear(random_leaf({2, 4}, 59), weight, weight), Error);      // x's width
  EXPECT_THROW(swiglu_linear(x, weight, weight.to(kFloat32)), Error);               // dtype
  EXPECT_THROW(swiglu_linear(x, random_leaf({20}, 60), random_leaf({20}, 61)), Error);  // 1-D weights
}

}  // namespace
}  // namespace weft
