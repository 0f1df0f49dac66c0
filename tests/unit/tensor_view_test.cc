// Tensor factories, properties, views and copies: views share storage (a write through one is
// seen by the base), copies do not, element values follow the view geometry, and misuse throws
// weft::Error naming the op and the operand.
#include <cmath>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "runtime/weft.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

// [[0, 1, 2], [3, 4, 5]] as f32 (or another dtype).
Tensor two_by_three(DType dtype = kFloat32) {
  return Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3}, dtype);
}

// [2, 3, 4] holding 0..23.
Tensor counting_cube() { return Tensor::arange(24, kFloat32).view({2, 3, 4}); }

TEST(TensorFactories, FillValuesShapesAndDtypes) {
  Tensor zeros = Tensor::zeros({2, 3});
  EXPECT_EQ(zeros.shape(), (Shape{2, 3}));
  EXPECT_EQ(zeros.dtype(), kFloat32);
  EXPECT_TRUE(zeros.device().is_cpu());
  EXPECT_EQ(zeros.to_vector(), std::vector<double>(6, 0.0));

  Tensor ones = Tensor::ones({4}, kInt32);
  EXPECT_EQ(ones.dtype(), kInt32);
  EXPECT_EQ(ones.to_vector(), std::vector<double>(4, 1.0));

  Tensor full = Tensor::full({3, 1}, -2.5, kFloat64);
  EXPECT_EQ(full.to_vector(), std::vector<double>(3, -2.5));
  // A bf16 fill rounds once: 1 + 2^-8 is a tie and goes to 1.0.
  EXPECT_EQ(Tensor::full({2}, 1.0 + std::ldexp(1.0, -8), kBFloat16).at({1}), 1.0);

  Tensor from_doubles = Tensor::from_vector(std::vector<double>{1.5, -2, 3}, {3, 1}, kFloat64);
  EXPECT_EQ(from_doubles.at({2, 0}), 3.0);
  Tensor from_floats = Tensor::from_vector(std::vector<float>{1.5f, 2.5f}, {2}, kFloat16);
  EXPECT_EQ(from_floats.dtype(), kFloat16);
  EXPECT_EQ(from_floats.to_vector(), (std::vector<double>{1.5, 2.5}));
  Tensor from_ints = Tensor::from_vector(std::vector<int64_t>{int64_t{1} << 50, -7}, {2});
  EXPECT_EQ(from_ints.dtype(), kInt64);
  EXPECT_EQ(from_ints.data<int64_t>()[0], int64_t{1} << 50);  // exact, not through double rounding
  EXPECT_EQ(from_ints.data<int64_t>()[1], -7);

  Tensor range = Tensor::arange(5);
  EXPECT_EQ(range.dtype(), kInt64);
  EXPECT_EQ(range.shape(), (Shape{5}));
  EXPECT_EQ(range.to_vector(), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::arange(3, kFloat32).to_vector(), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(Tensor::arange(0).numel(), 0);

  Tensor scalar = Tensor::scalar(7.25);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.shape().empty());
  EXPECT_EQ(scalar.item(), 7.25);
  EXPECT_EQ(scalar.at({}), 7.25);

  Tensor empty = Tensor::zeros({0, 3});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.to_vector().empty());
}

TEST(TensorFactories, BadArgumentsThrow) {
  expect_contains(error_message([] { Tensor::from_vector(std::vector<double>{1, 2, 3}, {2, 2}); }),
                  {"from_vector", "3", "[2, 2]"});
  expect_contains(error_message([] { Tensor::zeros({2, -1}); }), {"empty", "[2, -1]"});
  expect_contains(error_message([] { Tensor::uniform({2}, 1, 0, 0.0, 1.0, kInt32); }), {"uniform", "i32"});
}

TEST(TensorProperties, SizesStridesAndDescribe) {
  Tensor cube = counting_cube();
  EXPECT_EQ(cube.dim(), 3);
  EXPECT_EQ(cube.numel(), 24);
  EXPECT_EQ(cube.size(0), 2);
  EXPECT_EQ(cube.size(-1), 4);
  EXPECT_EQ(cube.size(-3), 2);
  EXPECT_EQ(cube.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(cube.stride(-2), 4);
  EXPECT_EQ(cube.element_size(), 4);
  EXPECT_EQ(cube.offset(), 0);
  EXPECT_EQ(cube.describe(), "f32[2, 3, 4] cpu");
  EXPECT_EQ(Tensor::zeros({5}, kBFloat16).describe(), "bf16[5] cpu");
  EXPECT_EQ(Tensor::scalar(1, kInt64).describe(), "i64[] cpu");
  EXPECT_EQ(Tensor::zeros({1}, kFloat64).element_size(), 8);
  EXPECT_EQ(Tensor().describe(), "undefined");
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorProperties, IsContiguous) {
  Tensor cube = counting_cube();
  EXPECT_TRUE(cube.is_contiguous());
  EXPECT_FALSE(cube.transpose(0, 1).is_contiguous());
  EXPECT_FALSE(cube.permute({2, 0, 1}).is_contiguous());
  EXPECT_TRUE(cube.narrow(0, 1, 1).is_contiguous());   // a row block: offset moves, strides stay
  EXPECT_EQ(cube.narrow(0, 1, 1).offset(), 12);
  EXPECT_FALSE(cube.narrow(2, 0, 2).is_contiguous());  // gaps inside each row
  EXPECT_TRUE(cube.narrow(1, 1, 1).squeeze(1).narrow(0, 1, 1).is_contiguous());
  EXPECT_FALSE(Tensor::zeros({3, 1}).expand({3, 4}).is_contiguous());
  // Size-1 dims may have any stride.
  EXPECT_TRUE(Tensor::zeros({1, 4}).transpose(0, 1).transpose(0, 1).is_contiguous());
  EXPECT_TRUE(Tensor::zeros({4}).unsqueeze(0).is_contiguous());
  EXPECT_TRUE(Tensor::zeros({4, 1}).transpose(0, 1).is_contiguous());
}

TEST(TensorViews, ViewInfersMinusOneAndSharesStorage) {
  Tensor cube = counting_cube();
  Tensor flat = cube.view({-1});
  EXPECT_EQ(flat.shape(), (Shape{24}));
  Tensor matrix = cube.view({-1, 4});
  EXPECT_EQ(matrix.shape(), (Shape{6, 4}));
  EXPECT_EQ(cube.view({4, -1, 2}).shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(matrix.storage(), cube.storage());
  EXPECT_EQ(matrix.at({5, 3}), 23.0);
  EXPECT_EQ(matrix.at({2, 1}), 9.0);
  matrix.set({2, 1}, -9.0);
  EXPECT_EQ(cube.at({0, 2, 1}), -9.0);
  EXPECT_EQ(flat.at({9}), -9.0);
  // A one-element tensor views as a scalar and back.
  Tensor one = Tensor::full({1, 1}, 3.0);
  EXPECT_EQ(one.view({}).dim(), 0);
  EXPECT_EQ(one.view({}).view({1, 1, 1}).at({0, 0, 0}), 3.0);
}

TEST(TensorViews, ViewOfNonContiguousStridesWhereAllowed) {
  Tensor cube = counting_cube();
  // Splitting and merging dims that stay adjacent in memory works without a copy, even on a
  // permuted tensor.
  Tensor permuted = cube.permute({1, 0, 2});  // [3, 2, 4], strides [4, 12, 1]
  Tensor split = permuted.view({3, 2, 2, 2});
  EXPECT_EQ(split.storage(), cube.storage());
  EXPECT_EQ(split.at({2, 1, 1, 0}), cube.at({1, 2, 2}));
  Tensor column = cube.narrow(2, 1, 1);  // [2, 3, 1], strides [12, 4, 1]
  Tensor merged = column.view({6});
  EXPECT_EQ(merged.storage(), cube.storage());
  EXPECT_EQ(merged.to_vector(), (std::vector<double>{1, 5, 9, 13, 17, 21}));
  // Broadcast dims merge into one stride-0 dim.
  Tensor broadcast = Tensor::arange(3, kFloat32).expand({2, 2, 3});
  Tensor broadcast_view = broadcast.view({4, 3});
  EXPECT_EQ(broadcast_view.stride(0), 0);
  EXPECT_EQ(broadcast_view.at({3, 2}), 2.0);
}

TEST(TensorViews, ReshapeViewsWhenPossibleAndCopiesOtherwise) {
  Tensor base = two_by_three();
  Tensor viewed = base.reshape({3, 2});
  EXPECT_EQ(viewed.storage(), base.storage());

  Tensor transposed = base.transpose(0, 1);  // [3, 2], strides [1, 3]
  const std::string message = error_message([&] { transposed.view({6}); });
  expect_contains(message, {"view", "[3, 2]", "[6]", "reshape"});
  Tensor flattened = transposed.reshape({6});
  EXPECT_NE(flattened.storage(), base.storage());
  EXPECT_TRUE(flattened.is_contiguous());
  EXPECT_EQ(flattened.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(transposed.flatten().to_vector(), flattened.to_vector());
  // A copy really is a copy.
  flattened.set({0}, 100.0);
  EXPECT_EQ(base.at({0, 0}), 0.0);

  // Expanded tensors cannot be flattened in place either.
  Tensor expanded = Tensor::arange(3, kFloat32).view({3, 1}).expand({3, 2});
  EXPECT_THROW(expanded.view({6}), Error);
  EXPECT_EQ(expanded.reshape({6}).to_vector(), (std::vector<double>{0, 0, 1, 1, 2, 2}));
  // So can a narrowed row.
  Tensor narrowed = Tensor::arange(12, kFloat32).view({3, 4}).narrow(1, 1, 2);
  EXPECT_THROW(narrowed.view({6}), Error);
  EXPECT_EQ(narrowed.reshape({-1}).to_vector(), (std::vector<double>{1, 2, 5, 6, 9, 10}));
}

TEST(TensorViews, PermuteAndTranspose) {
  Tensor cube = counting_cube();
  Tensor permuted = cube.permute({2, 0, 1});
  EXPECT_EQ(permuted.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(permuted.strides(), (Strides{1, 12, 4}));
  EXPECT_EQ(permuted.storage(), cube.storage());
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(permuted.at({k, i, j}), cube.at({i, j, k}));
    }
  }
  permuted.set({3, 1, 2}, -1.0);
  EXPECT_EQ(cube.at({1, 2, 3}), -1.0);
  // Negative dims, and transpose as a permute of two dims.
  Tensor transposed = cube.transpose(-1, 0);
  EXPECT_EQ(transposed.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(transposed.at({1, 2, 0}), cube.at({0, 2, 1}));
  EXPECT_EQ(cube.permute({-1, -3, -2}).shape(), permuted.shape());
  EXPECT_EQ(cube.transpose(1, 1).strides(), cube.strides());
}

TEST(TensorViews, NarrowSliceAndSelect) {
  Tensor cube = counting_cube();
  Tensor narrowed = cube.narrow(1, 1, 2);  // [2, 2, 4]
  EXPECT_EQ(narrowed.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(narrowed.offset(), 4);
  EXPECT_EQ(narrowed.at({1, 0, 3}), cube.at({1, 1, 3}));
  narrowed.set({0, 1, 0}, 99.0);
  EXPECT_EQ(cube.at({0, 2, 0}), 99.0);
  EXPECT_EQ(cube.narrow(2, 4, 0).numel(), 0);  // empty narrow at the end is allowed

  // Negative indices count from the end; out-of-range bounds clamp.
  Tensor row = Tensor::arange(10, kFloat32);
  EXPECT_EQ(row.slice(0, -3, 10).to_vector(), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(row.slice(0, 2, -5).to_vector(), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(row.slice(-1, -4, -2).to_vector(), (std::vector<double>{6, 7}));
  EXPECT_EQ(row.slice(0, 8, 100).to_vector(), (std::vector<double>{8, 9}));
  EXPECT_EQ(row.slice(0, -100, 2).to_vector(), (std::vector<double>{0, 1}));
  EXPECT_EQ(row.slice(0, 6, 3).numel(), 0);
  Tensor sliced = cube.slice(2, -2, 4);
  EXPECT_EQ(sliced.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(sliced.at({1, 1, 0}), cube.at({1, 1, 2}));
  EXPECT_EQ(sliced.storage(), cube.storage());

  Tensor last = cube.select(0, -1);  // [3, 4]
  EXPECT_EQ(last.shape(), (Shape{3, 4}));
  EXPECT_EQ(last.at({2, 3}), 23.0);
  Tensor middle_column = cube.select(-1, 1);  // [2, 3]
  EXPECT_EQ(middle_column.shape(), (Shape{2, 3}));
  EXPECT_EQ(middle_column.to_vector(), (std::vector<double>{1, 5, 9, 13, 17, 21}));
  middle_column.set({1, 2}, -21.0);
  EXPECT_EQ(cube.at({1, 2, 1}), -21.0);
  EXPECT_EQ(cube.select(0, 1).select(0, 1).select(0, 1).dim(), 0);
  EXPECT_EQ(cube.select(0, 1).select(0, 1).select(0, 1).item(), 17.0);
}

TEST(TensorViews, ExpandUnsqueezeSqueeze) {
  Tensor column = Tensor::from_vector(std::vector<double>{1, 2, 3}, {3, 1});
  Tensor expanded = column.expand({2, 3, 4});
  EXPECT_EQ(expanded.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(expanded.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(expanded.storage(), column.storage());
  EXPECT_EQ(expanded.at({1, 2, 3}), 3.0);
  column.set({1, 0}, 20.0);  // visible at every broadcast position
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(expanded.at({i, 1, k}), 20.0);
  }
  EXPECT_EQ(column.expand({-1, 5}).shape(), (Shape{3, 5}));
  EXPECT_EQ(column.expand({3, 1}).strides(), column.strides());

  Tensor row = Tensor::arange(4, kFloat32);
  EXPECT_EQ(row.unsqueeze(0).shape(), (Shape{1, 4}));
  EXPECT_EQ(row.unsqueeze(-1).shape(), (Shape{4, 1}));
  EXPECT_EQ(row.unsqueeze(1).shape(), (Shape{4, 1}));
  EXPECT_EQ(row.unsqueeze(-1).at({3, 0}), 3.0);
  EXPECT_EQ(row.unsqueeze(0).storage(), row.storage());
  // Unsqueeze of a transposed tensor is still a view.
  Tensor transposed = two_by_three().transpose(0, 1);  // [3, 2]
  Tensor lifted = transposed.unsqueeze(1);                // [3, 1, 2]
  EXPECT_EQ(lifted.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(lifted.storage(), transposed.storage());
  EXPECT_EQ(lifted.at({2, 0, 1}), 5.0);

  Tensor squeezed = row.unsqueeze(0).unsqueeze(2).squeeze(0);  // [4, 1]
  EXPECT_EQ(squeezed.shape(), (Shape{4, 1}));
  EXPECT_EQ(squeezed.squeeze(-1).shape(), (Shape{4}));
  EXPECT_EQ(squeezed.storage(), row.storage());
}

TEST(TensorCopies, ContiguousCloneDetach) {
  Tensor base = two_by_three();
  EXPECT_TRUE(base.contiguous().is_same(base));  // no copy when already contiguous
  Tensor transposed = base.transpose(0, 1);
  Tensor packed = transposed.contiguous();
  EXPECT_TRUE(packed.is_contiguous());
  EXPECT_NE(packed.storage(), base.storage());
  EXPECT_EQ(packed.strides(), (Strides{2, 1}));
  EXPECT_EQ(packed.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));

  Tensor copy = base.clone();
  EXPECT_NE(copy.storage(), base.storage());
  EXPECT_EQ(copy.to_vector(), base.to_vector());
  copy.set({0, 0}, 50.0);
  EXPECT_EQ(base.at({0, 0}), 0.0);
  Tensor view_copy = base.narrow(1, 1, 2).clone();  // clone of a view: only the view's elements
  EXPECT_EQ(view_copy.shape(), (Shape{2, 2}));
  EXPECT_EQ(view_copy.offset(), 0);
  EXPECT_EQ(view_copy.to_vector(), (std::vector<double>{1, 2, 4, 5}));

  Tensor parameter = Tensor::ones({2, 2}).set_requires_grad(true);
  Tensor detached = parameter.detach();
  EXPECT_FALSE(detached.requires_grad());
  EXPECT_TRUE(detached.is_leaf());
  EXPECT_TRUE(parameter.requires_grad());
  EXPECT_EQ(detached.storage(), parameter.storage());
  detached.set({1, 1}, 4.0);
  EXPECT_EQ(parameter.at({1, 1}), 4.0);
  Tensor detached_view = base.narrow(1, 1, 2).detach();
  EXPECT_EQ(detached_view.offset(), 1);
  EXPECT_EQ(detached_view.strides(), (Strides{3, 1}));
}

TEST(TensorInPlace, FillAndCopyBroadcastAndConvert) {
  Tensor matrix = Tensor::zeros({3, 4});
  matrix.narrow(1, 2, 1).fill_(7.0);  // one column of a non-contiguous view
  EXPECT_EQ(matrix.to_vector(), (std::vector<double>{0, 0, 7, 0, 0, 0, 7, 0, 0, 0, 7, 0}));
  matrix.transpose(0, 1).select(0, 0).fill_(-1.0);  // column 0
  EXPECT_EQ(matrix.at({2, 0}), -1.0);
  EXPECT_EQ(matrix.at({2, 1}), 0.0);

  // A row of another dtype broadcast over every row.
  Tensor row = Tensor::from_vector(std::vector<double>{1.5, 2.5, 3.5, 4.5}, {4}, kFloat64);
  matrix.copy_(row);
  EXPECT_EQ(matrix.to_vector(), (std::vector<double>{1.5, 2.5, 3.5, 4.5, 1.5, 2.5, 3.5, 4.5, 1.5, 2.5, 3.5, 4.5}));
  // A column into a transposed view.
  Tensor ints = Tensor::from_vector(std::vector<int64_t>{10, 20, 30, 40}, {4, 1});
  matrix.transpose(0, 1).copy_(ints);  // view [4, 3]: row r of the view = column r of matrix
  EXPECT_EQ(matrix.at({0, 0}), 10.0);
  EXPECT_EQ(matrix.at({2, 3}), 40.0);
  EXPECT_EQ(matrix.at({1, 1}), 20.0);
  // Into bf16, rounding to nearest even.
  Tensor half = Tensor::zeros({2}, kBFloat16);
  half.copy_(Tensor::from_vector(std::vector<double>{1.0 + std::ldexp(1.0, -8), 3.0}, {2}, kFloat32));
  EXPECT_EQ(half.to_vector(), (std::vector<double>{1.0, 3.0}));
  // Float into integers truncates.
  Tensor counts = Tensor::zeros({2}, kInt64);
  counts.copy_(Tensor::from_vector(std::vector<double>{2.9, -2.9}, {2}));
  EXPECT_EQ(counts.to_vector(), (std::vector<double>{2.0, -2.0}));
  EXPECT_EQ(&counts.zero_(), &counts);
  EXPECT_EQ(counts.to_vector(), (std::vector<double>{0.0, 0.0}));

  expect_contains(error_message([&] { matrix.copy_(Tensor::zeros({3})); }), {"copy_", "[3]", "[3, 4]"});
  expect_contains(error_message([&] { matrix.copy_(Tensor()); }), {"copy_", "undefined"});
}

TEST(TensorPrinting, ToVectorToStringAndStream) {
  Tensor values = Tensor::from_vector(std::vector<double>{1, 2.5, -3, 4e-7}, {2, 2});
  EXPECT_EQ(values.to_string(), "Tensor(f32[2, 2] cpu, [1, 2.5, -3, 4e-07])");
  EXPECT_EQ(values.transpose(0, 1).to_vector(),
            (std::vector<double>{1, -3, 2.5, static_cast<double>(4e-7f)}));  // logical order
  EXPECT_EQ(Tensor::arange(5).to_string(3), "Tensor(i64[5] cpu, [0, 1, 2, ...])");
  EXPECT_EQ(Tensor::scalar(0.125, kFloat64).to_string(), "Tensor(f64[] cpu, [0.125])");
  EXPECT_EQ(Tensor().to_string(), "Tensor(undefined)");
  std::ostringstream stream;
  stream << values.transpose(0, 1);
  EXPECT_EQ(stream.str(), "Tensor(f32[2, 2] cpu, [1, -3, 2.5, 4e-07])");
  // Printing a tensor that requires grad records no history.
  Tensor parameter = Tensor::ones({1}).set_requires_grad(true);
  EXPECT_EQ(parameter.to_string(), "Tensor(f32[1] cpu, [1])");
}

TEST(TensorErrors, MessagesNameTheOpAndTheShape) {
  Tensor base = two_by_three();
  expect_contains(error_message([&] { base.view({4, 4}); }), {"view", "[4, 4]", "[2, 3]"});
  expect_contains(error_message([&] { base.view({-1, -1}); }), {"view", "-1"});
  expect_contains(error_message([&] { base.view({-1, 4}); }), {"view", "[2, 3]", "[-1, 4]"});
  expect_contains(error_message([&] { base.reshape({5}); }), {"reshape", "[5]", "[2, 3]"});
  expect_contains(error_message([&] { base.narrow(1, 2, 2); }), {"narrow", "[2, 3]"});
  expect_contains(error_message([&] { base.narrow(0, -1, 1); }), {"narrow", "[2, 3]"});
  expect_contains(error_message([&] { base.select(0, 2); }), {"select", "2", "[2, 3]"});
  expect_contains(error_message([&] { base.select(1, -4); }), {"select", "-4", "[2, 3]"});
  expect_contains(error_message([&] { base.expand({4, 3}); }), {"expand", "[2, 3]", "[4, 3]"});
  expect_contains(error_message([&] { base.expand({3}); }), {"expand", "[2, 3]", "[3]"});
  expect_contains(error_message([&] { base.permute({0}); }), {"permute", "[0]", "[2, 3]"});
  expect_contains(error_message([&] { base.permute({1, 1}); }), {"permute", "[1, 1]"});
  expect_contains(error_message([&] { base.squeeze(1); }), {"squeeze", "[2, 3]"});
  expect_contains(error_message([&] { base.at({2, 0}); }), {"index", "[2, 3]"});
  expect_contains(error_message([&] { base.at({0}); }), {"rank", "[2, 3]"});
  expect_contains(error_message([&] { base.item(); }), {"item", "[2, 3]"});
  // Out-of-range dims name the op and the valid range.
  expect_contains(error_message([&] { base.transpose(0, 2); }), {"transpose", "2", "rank 2"});
  expect_contains(error_message([&] { base.unsqueeze(4); }), {"unsqueeze", "4", "rank 3"});
  expect_contains(error_message([&] { base.size(-3); }), {"size", "-3", "rank 2"});
  expect_contains(error_message([&] { base.slice(2, 0, 1); }), {"slice", "2"});
  expect_contains(error_message([&] { base.select(-3, 0); }), {"select", "-3"});
}

// weft/error.h: "The message names the op and the operands." An out-of-range dim is a mistake
// about a particular tensor, so the message should show that tensor's shape, not only its rank.
TEST(TensorErrors, OutOfRangeDimMessagesNameTheShape) {
  Tensor base = two_by_three();
  expect_contains(error_message([&] { base.transpose(0, 2); }), {"transpose", "[2, 3]"});
  expect_contains(error_message([&] { base.narrow(2, 0, 1); }), {"narrow", "[2, 3]"});
  expect_contains(error_message([&] { base.squeeze(-3); }), {"squeeze", "[2, 3]"});
  expect_contains(error_message([&] { base.permute({0, 2}); }), {"permute", "[2, 3]"});
}

}  // namespace
}  // namespace weft
