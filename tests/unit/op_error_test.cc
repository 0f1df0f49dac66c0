// Bad inputs to the differentiable ops raise weft::Error (never a crash or another exception type)
// with a message that names the op and the offending operands' shapes and dtypes, so a user can
// tell what to fix from the message alone (runtime/error.h, runtime/ops/op_checks.h).
//
// Cases that could crash the process (undefined operands) run in a death-test child, so a crash
// fails that test instead of ending the program.
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#if defined(WEFT_HAVE_CUDA)
#include "runtime/cuda/stream.h"
#endif
#include "runtime/weft.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

// Expects `body` to throw weft::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& body, std::initializer_list<std::string> parts) {
  const std::string message = error_message(body);
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "message \"" << message << "\" lacks \"" << part << "\"";
  }
}

Tensor ids(std::vector<int64_t> values, DType dtype = kInt64) {
  const int64_t count = static_cast<int64_t>(values.size());
  return Tensor::from_vector(absl::Span<const int64_t>(values), {count}, dtype);
}

// --- Elementwise ---------------------------------------------------------------------------

TEST(OpError, AddOfUnbroadcastableShapesNamesBoth) {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  expect_error([&] { add(a, b); }, {"add", "[2, 3]", "[4]"});
  expect_error([&] { (void)(a + b); }, {"add", "[2, 3]", "[4]"});
  expect_error([&] { sub(a, b); }, {"sub", "[2, 3]", "[4]"});
  expect_error([&] { div(Tensor::zeros({3, 1, 5}), Tensor::zeros({4, 2})); }, {"div", "[3, 1, 5]", "[4, 2]"});
}

TEST(OpError, MulOfF32AndF64NamesTheDtypes) {
  const Tensor a = Tensor::zeros({2, 3}, kFloat32), b = Tensor::zeros({2, 3}, kFloat64);
  expect_error([&] { mul(a, b); }, {"mul", "dtype", "f32", "f64"});
  expect_error([&] { add(Tensor::zeros({3}, kBFloat16), Tensor::zeros({3}, kFloat16)); }, {"add", "dtype", "bf16", "f16"});
}

TEST(OpError, ElementwiseOnIntegerTensors) {
  const Tensor integers = Tensor::arange(4);
  expect_error([&] { add(integers, integers); }, {"add", "i64[4]", "floating"});
  expect_error([&] { gelu(integers); }, {"gelu", "i64[4]"});
  expect_error([&] { scale(integers, 2.0); }, {"scale", "i64[4]"});
  expect_error([&] { softmax(integers); }, {"softmax", "i64[4]"});
  expect_error([&] { sum(integers); }, {"sum", "i64[4]"});
}

// --- Reductions ----------------------------------------------------------------------------

TEST(OpError, ReductionDimsOutOfRange) {
  const Tensor x = Tensor::zeros({2, 3});
  expect_error([&] { sum(x, {2}); }, {"sum", "dim 2", "rank 2"});
  expect_error([&] { mean(x, {-3}); }, {"mean", "dim -3"});
  expect_error([&] { sum(x, {1, -1}); }, {"sum", "repeat"});
  expect_error([&] { max(x, 5); }, {"max", "dim 5"});
  expect_error([&] { max(Tensor::zeros({2, 0}), 1); }, {"max", "f32[2, 0]", "empty"});
  expect_error([&] { softmax(x, 2); }, {"softmax", "dim 2"});
}

// --- Matmul and linear ---------------------------------------------------------------------

TEST(OpError, MatmulInnerDimMismatchNamesBothShapes) {
  expect_error([] { matmul(Tensor::zeros({3, 4}), Tensor::zeros({5, 6})); }, {"matmul", "[3, 4]", "[5, 6]"});
  expect_error([] { matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({2, 5, 6})); }, {"matmul", "[2, 3, 4]", "[2, 5, 6]"});
}

TEST(OpError, MatmulOfOneDimensionalOperand) {
  expect_error([] { matmul(Tensor::zeros({4}), Tensor::zeros({4, 3})); }, {"matmul", "[4]", "[4, 3]", "2 dims"});
  expect_error([] { matmul(Tensor::zeros({3, 4}), Tensor::zeros({4})); }, {"matmul", "[3, 4]", "[4]"});
  expect_error([] { matmul(Tensor::scalar(1.0), Tensor::zeros({1, 1})); }, {"matmul", "[]"});
}

TEST(OpError, MatmulDtypeMismatch) {
  expect_error([] { matmul(Tensor::zeros({3, 4}), Tensor::zeros({4, 2}, kFloat64)); }, {"matmul", "dtype", "f32", "f64"});
}

TEST(OpError, MatmulBatchMismatchNamesBothOperands) {
  // Batch dims [2] and [3] cannot broadcast; the message should name the operands, not only the
  // batch shapes, so the user can tell which tensors were multiplied.
  expect_error([] { matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})); },
               {"matmul", "[2, 3, 4]", "[3, 4, 5]"});
}

TEST(OpError, LinearShapeMismatch) {
  expect_error([] { linear(Tensor::zeros({2, 7}), Tensor::zeros({9, 5})); }, {"linear", "[2, 7]", "[9, 5]"});
  expect_error([] { linear(Tensor::zeros({2, 7}), Tensor::zeros({9, 7}), Tensor::zeros({7})); },
               {"linear", "bias", "[9]", "[7]"});
  expect_error([] { linear(Tensor::zeros({2, 7}), Tensor::zeros({7})); }, {"linear", "weight", "2 dims", "[7]"});
}

TEST(OpError, LinearDtypeMismatchNamesLinear) {
  // linear forwards to matmul on weight^T; its errors should still say "linear" and show the
  // weight as the caller passed it ([9, 7]), not the transposed [7, 9] operand of the inner matmul.
  expect_error([] { linear(Tensor::zeros({2, 7}), Tensor::zeros({9, 7}, kFloat64)); },
               {"linear", "f32[2, 7]", "f64[9, 7]"});
  expect_error([] { linear(Tensor::zeros({2, 7}), Tensor::zeros({9, 7}, kInt64)); }, {"linear", "i64[9, 7]"});
}

// --- Normalization -------------------------------------------------------------------------

TEST(OpError, LayerNormWeightOfWrongSize) {
  const Tensor x = Tensor::zeros({2, 7});
  expect_error([&] { layer_norm(x, Tensor::ones({5}), Tensor()); }, {"layer_norm", "weight", "[7]", "[5]"});
  expect_error([&] { layer_norm(x, Tensor::ones({7}), Tensor::zeros({6})); }, {"layer_norm", "bias", "[7]", "[6]"});
  expect_error([&] { layer_norm(x, Tensor::ones({7}, kBFloat16), Tensor()); }, {"layer_norm", "dtype", "f32", "bf16"});
  expect_error([&] { layer_norm(x, Tensor::ones({7}), Tensor(), 0.0); }, {"layer_norm", "eps"});
  expect_error([&] { rms_norm(x, Tensor::ones({2, 7})); }, {"rms_norm", "weight", "[7]", "[2, 7]"});
  expect_error([&] { layer_norm(Tensor::scalar(1.0), Tensor::ones({1}), Tensor()); }, {"layer_norm", "f32[]"});
}

// --- Embedding -----------------------------------------------------------------------------

TEST(OpError, EmbeddingIdOutOfRangeNamesIdAndVocabulary) {
  const Tensor weight = Tensor::zeros({5, 3});
  expect_error([&] { embedding(ids({1, 7, 2}), weight); }, {"embedding", "id 7", "5"});
  expect_error([&] { embedding(ids({1, 7, 2}, kInt32), weight); }, {"embedding", "id 7", "5"});
  expect_error([&] { embedding(ids({-1}), weight); }, {"embedding", "id -1", "5"});
  expect_error([&] { embedding(ids({5}), weight); }, {"embedding", "id 5", "[0, 5)"});
}

TEST(OpError, EmbeddingBackwardWithABadIdChangesNothing) {
  // The backward may add into a parameter's .grad itself: a bad id anywhere stops it before any row
  // is added.
  Tensor grad_weight = Tensor::full({5, 3}, 0.5);
  expect_error(
      [&] { backend_for(Device::cpu()).embedding_backward(ids({1, 2, 7}), Tensor::ones({3, 3}), grad_weight); },
      {"embedding_backward", "id 7", "position 2", "[0, 5)"});
  EXPECT_EQ(grad_weight.to_vector(), std::vector<double>(15, 0.5));
}

TEST(OpError, EmbeddingWithFloatIds) {
  const Tensor weight = Tensor::zeros({5, 3});
  expect_error([&] { embedding(Tensor::zeros({3}), weight); }, {"embedding", "ids", "f32[3]", "i32", "i64"});
  expect_error([&] { embedding(ids({1}), Tensor::zeros({5})); }, {"embedding", "weight", "2 dims", "[5]"});
  expect_error([&] { embedding(ids({1}), Tensor::arange(5)); }, {"embedding", "weight", "i64[5]"});
}

// --- Cross-entropy -------------------------------------------------------------------------

TEST(OpError, CrossEntropyTargetOutOfRange) {
  const Tensor logits = Tensor::zeros({3, 4});
  expect_error([&] { cross_entropy(logits, ids({0, 9, 1})); }, {"cross_entropy", "target 9", "4"});
  expect_error([&] { cross_entropy(logits, ids({0, 9, 1}, kInt32)); }, {"cross_entropy", "target 9", "4"});
  // -1 is not the ignore_index (-100), so it is out of range, not ignored.
  expect_error([&] { cross_entropy(logits, ids({0, -1, 1})); }, {"cross_entropy", "target -1", "ignore_index"});
  expect_error([&] { cross_entropy(logits, ids({0, 4, 1}), /*ignore_index=*/3); }, {"cross_entropy", "target 4"});
}

TEST(OpError, CrossEntropyTargetsOfWrongLength) {
  const Tensor logits = Tensor::zeros({3, 4});
  expect_error([&] { cross_entropy(logits, ids({0, 1})); }, {"cross_entropy", "targets", "[3]", "[2]"});
  expect_error([&] { cross_entropy(logits, Tensor::zeros({3})); }, {"cross_entropy", "targets", "f32[3]"});
  expect_error([&] { cross_entropy(Tensor::zeros({4}), ids({0})); }, {"cross_entropy", "logits", "2 dims", "[4]"});
}

// --- Attention -----------------------------------------------------------------------------

TEST(OpError, CausalAttentionWithThreeDimensionalQ) {
  const Tensor q3 = Tensor::zeros({2, 9, 5});
  expect_error([&] { causal_attention(q3, q3, q3); }, {"causal_attention", "q", "4 dims", "[2, 9, 5]"});
  const Tensor q = Tensor::zeros({2, 3, 9, 5});
  expect_error([&] { causal_attention(q, Tensor::zeros({2, 3, 8, 5}), q); },
               {"causal_attention", "k", "[2, 3, 9, 5]", "[2, 3, 8, 5]"});
  expect_error([&] { causal_attention(q, q, Tensor::zeros({2, 3, 9, 5}, kFloat16)); },
               {"causal_attention", "dtype", "f32", "f16"});
  // Grouped-query attention: the kv heads of k must divide q's heads, and v must have k's shape.
  expect_error([&] { causal_attention(q, Tensor::zeros({2, 2, 9, 5}), Tensor::zeros({2, 2, 9, 5})); },
               {"causal_attention", "2 kv heads", "3 query heads", "h / (H / KV)"});
  expect_error([&] { causal_attention(q, Tensor::zeros({2, 1, 9, 5}), Tensor::zeros({2, 3, 9, 5})); },
               {"causal_attention", "v", "[2, 1, 9, 5]", "[2, 3, 9, 5]"});
}

// --- Concat, split, dropout ----------------------------------------------------------------

TEST(OpError, ConcatOfMismatchedShapes) {
  expect_error([] { concat({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}, 1); }, {"concat", "[2, 3]", "[3, 3]"});
  expect_error([] { concat({Tensor::zeros({2, 3}), Tensor::zeros({2, 3, 1})}, 0); }, {"concat", "[2, 3]", "[2, 3, 1]"});
  expect_error([] { concat({Tensor::zeros({2, 3}), Tensor::zeros({2, 3}, kFloat64)}, 0); },
               {"concat", "dtype", "f32", "f64"});
  expect_error([] { concat({}, 0); }, {"concat"});
  expect_error([] { concat({Tensor::zeros({2, 3})}, 2); }, {"concat", "dim 2"});
}

TEST(OpError, SplitSizesNotAddingUp) {
  const Tensor x = Tensor::zeros({5, 4});
  expect_error([&] { split(x, {2, 2}, 0); }, {"split", "[2, 2]", "4", "5"});
  expect_error([&] { split(x, {3, 3}, 1); }, {"split", "[3, 3]", "6", "4"});
  expect_error([&] { split(x, {6, -1}, 0); }, {"split", "negative"});
}

TEST(OpError, DropoutProbabilityOutOfRange) {
  const Tensor x = Tensor::ones({4});
  expect_error([&] { dropout(x, 1.0, 1, 0); }, {"dropout", "1", "[0, 1)"});
  expect_error([&] { dropout(x, -0.1, 1, 0); }, {"dropout", "-0.1"});
  expect_error([&] { dropout(x, 1.0, 1, 0, /*training=*/false); }, {"dropout"});
  expect_error([&] { dropout(Tensor::arange(4), 0.5, 1, 0); }, {"dropout", "i64[4]"});
}

// --- Devices -------------------------------------------------------------------------------

// Without a usable CUDA device — a CPU-only build, or a CUDA build on a machine with no GPU (CI) —
// asking for a CUDA tensor is an error that says so, never a crash.
TEST(OpError, CudaTensorWithoutACudaDevice) {
  expect_error([] { Device::parse("gpu:0"); }, {"gpu:0"});
#if defined(WEFT_HAVE_CUDA)
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  expect_error([] { Tensor::zeros({2}, kFloat32, Device::cuda(0)); }, {"no CUDA device"});
  expect_error([] { Tensor::ones({2}).to(Device::cuda(0)); }, {"no CUDA device"});
#else
  expect_error([] { Tensor::zeros({2}, kFloat32, Device::cuda(0)); }, {"CUDA", "cuda:0"});
  expect_error([] { Tensor::empty({2, 3}, kFloat32, Device::cuda(1)); }, {"CUDA", "cuda:1"});
  expect_error([] { Tensor::normal({2}, 1, 0, 0.0, 1.0, kFloat32, Device::cuda(0)); }, {"CUDA"});
  expect_error([] { Tensor::from_vector(std::vector<double>{1.0, 2.0}, {2}, kFloat32, Device::cuda(0)); }, {"CUDA"});
  expect_error([] { Tensor::ones({2}).to(Device::cuda(0)); }, {"CUDA"});
  expect_error([] { backend_for(Device::cuda(0)); }, {"CUDA"});
#endif
}

// --- Undefined operands (each in a child process, so a crash is a failure, not an abort) ----

// Runs `body` in a death-test child; passes when it throws weft::Error there.
void expect_error_in_child(const std::function<void()>& body) {
  EXPECT_EXIT(
      {
        try {
          body();
        } catch (const Error&) {
          std::exit(0);
        } catch (...) {
          std::exit(2);
        }
        std::exit(3);
      },
      ::testing::ExitedWithCode(0), "");
}

class OpErrorUndefined : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(OpErrorUndefined, UndefinedOperandsThrow) {
  const Tensor x = Tensor::zeros({2, 3}), none;
  expect_error_in_child([&] { add(none, x); });
  expect_error_in_child([&] { add(x, none); });
  expect_error_in_child([&] { gelu(none); });
  expect_error_in_child([&] { sum(none); });
  expect_error_in_child([&] { matmul(x, none); });
  expect_error_in_child([&] { softmax(none); });
  expect_error_in_child([&] { layer_norm(x, none, none); });
  expect_error_in_child([&] { rms_norm(none, Tensor::ones({3})); });
  expect_error_in_child([&] { embedding(none, x); });
  expect_error_in_child([&] { cross_entropy(x, none); });
  expect_error_in_child([&] { causal_attention(none, none, none); });
  expect_error_in_child([&] { concat({x, none}, 0); });
  expect_error_in_child([&] { split(none, {1}, 0); });
  expect_error_in_child([&] { dropout(none, 0.5, 1, 0); });
}

TEST_F(OpErrorUndefined, LinearWithUndefinedWeightThrows) {
  const Tensor none;
  expect_error_in_child([&] { linear(Tensor::zeros({4, 2}), none); });
}

TEST_F(OpErrorUndefined, LinearWithUndefinedInputThrows) {
  const Tensor weight = Tensor::zeros({3, 2}), none;
  expect_error_in_child([&] { linear(none, weight); });
}

}  // namespace
}  // namespace weft
