// Forward values of every differentiable op against a plain-loop reference in double precision.
//
// Each reference reads its inputs element by element (Tensor::to_vector / at) and computes with
// nested loops, never through weft ops, so a kernel bug cannot hide in the reference. Inputs cover
// odd sizes, non-contiguous views (transposed, narrowed, expanded) and broadcasting. Tolerances are
// relative to the largest reference magnitude: 1e-5 for f32, 1e-12 for f64, and 1e-2 for bf16/f16
// storage against the f32 op on the same (rounded) inputs. Gradients are checked in
// op_gradient_test.cc; this file checks only values.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using Values = std::vector<double>;

constexpr double kFloat32Tolerance = 1e-5;
constexpr double kFloat64Tolerance = 1e-12;
constexpr double kHalfTolerance = 1e-2;

double tolerance_for(DType dtype) { return dtype == kFloat64 ? kFloat64Tolerance : kFloat32Tolerance; }

// A random floating tensor: normal(0, 1), or uniform in [low, high) when low < high.
Tensor random_normal(absl::Span<const int64_t> shape, uint64_t seed, DType dtype = kFloat32) {
  return Tensor::normal(shape, seed, 0, 0.0, 1.0, dtype);
}
Tensor random_uniform(absl::Span<const int64_t> shape, uint64_t seed, double low, double high,
                      DType dtype = kFloat32) {
  return Tensor::uniform(shape, seed, 0, low, high, dtype);
}

// Row-major multi-index of flat position `flat` in `shape`.
Shape unravel(int64_t flat, absl::Span<const int64_t> shape) {
  Shape index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

// Flat row-major position of `index` in `shape`.
int64_t ravel(absl::Span<const int64_t> index, absl::Span<const int64_t> shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

// The index into an operand of `shape` that numpy broadcasting reads for output index `out_index`.
Shape broadcast_source(absl::Span<const int64_t> out_index, absl::Span<const int64_t> shape) {
  const size_t lead = out_index.size() - shape.size();
  Shape index(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) index[d] = shape[d] == 1 ? 0 : out_index[lead + d];
  return index;
}

Shape broadcast_reference_shape(absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t size_a = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t size_b = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    out[i] = size_a == 1 ? size_b : size_a;
  }
  return out;
}

// Checks shape, absence of NaN, and max |actual - expected| / max |expected| <= tolerance.
void expect_matches(const Tensor& actual, absl::Span<const int64_t> expected_shape, const Values& expected,
                    double tolerance, const std::string& what) {
  ASSERT_EQ(shape_string(actual.shape()), shape_string(expected_shape)) << what;
  ASSERT_EQ(static_cast<size_t>(actual.numel()), expected.size()) << what;
  const Values got = actual.to_vector();
  double scale = 0, worst = 0;
  int64_t worst_index = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": NaN at element " << i;
    scale = std::max(scale, std::fabs(expected[i]));
    const double difference = std::fabs(got[i] - expected[i]);
    if (!(difference <= worst)) {
      worst = difference;
      worst_index = static_cast<int64_t>(i);
    }
  }
  const double relative = worst / std::max(scale, 1e-30);
  EXPECT_LE(relative, tolerance) << what << ": worst element " << worst_index << " got "
                                 << (worst_index >= 0 ? got[worst_index] : 0.0) << " expected "
                                 << (worst_index >= 0 ? expected[worst_index] : 0.0);
}

void expect_no_nan(const Tensor& tensor, const std::string& what) {
  for (double value : tensor.to_vector()) {
    ASSERT_FALSE(std::isnan(value)) << what;
    ASSERT_FALSE(std::isinf(value)) << what;
  }
}

// --- Elementwise ---------------------------------------------------------------------------

double binary_reference(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
  }
  return 0;
}

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::kAdd: return add(a, b);
    case BinaryOp::kSub: return sub(a, b);
    case BinaryOp::kMul: return mul(a, b);
    case BinaryOp::kDiv: return div(a, b);
  }
  return Tensor();
}

// op(a, b) with numpy broadcasting, by reading each operand at its broadcast index.
Values binary_reference_values(BinaryOp op, const Tensor& a, const Tensor& b, Shape* out_shape) {
  *out_shape = broadcast_reference_shape(a.shape(), b.shape());
  Values out(static_cast<size_t>(shape_numel(*out_shape)));
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    const Shape index = unravel(i, *out_shape);
    out[i] = binary_reference(op, a.at(broadcast_source(index, a.shape())), b.at(broadcast_source(index, b.shape())));
  }
  return out;
}

struct BinaryCase {
  std::string name;
  Tensor a, b;
};

std::vector<BinaryCase> binary_cases(DType dtype) {
  std::vector<BinaryCase> cases;
  // Denominators are uniform in [0.5, 2) so div stays well conditioned.
  cases.push_back({"same shape [7, 13]", random_normal({7, 13}, 1, dtype), random_uniform({7, 13}, 2, 0.5, 2, dtype)});
  cases.push_back({"broadcast [3, 1, 5] with [4, 1]", random_normal({3, 1, 5}, 3, dtype),
                   random_uniform({4, 1}, 4, 0.5, 2, dtype)});
  cases.push_back({"broadcast [13] with [7, 13]", random_normal({13}, 5, dtype),
                   random_uniform({7, 13}, 6, 0.5, 2, dtype)});
  cases.push_back({"scalar with [7]", random_normal({}, 7, dtype), random_uniform({7}, 8, 0.5, 2, dtype)});
  cases.push_back({"transposed a", random_normal({13, 7}, 9, dtype).transpose(0, 1),
                   random_uniform({7, 13}, 10, 0.5, 2, dtype)});
  cases.push_back({"narrowed a and b", random_normal({9, 17}, 11, dtype).narrow(1, 3, 13).narrow(0, 1, 7),
                   random_uniform({7, 33}, 12, 0.5, 2, dtype).slice(1, 20, 33)});
  cases.push_back({"expanded b view", random_normal({5, 7, 13}, 13, dtype),
                   random_uniform({1, 13}, 14, 0.5, 2, dtype).expand({5, 7, 13})});
  cases.push_back({"both transposed and broadcast", random_normal({13, 1, 7}, 15, dtype).permute({2, 1, 0}),
                   random_uniform({5, 1}, 16, 0.5, 2, dtype)});
  return cases;
}

TEST(OpForward, BinaryOpsBroadcastAndViews) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const BinaryCase& c : binary_cases(dtype)) {
      for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
        Shape shape;
        const Values expected = binary_reference_values(op, c.a, c.b, &shape);
        const Tensor out = binary_op(op, c.a, c.b);
        EXPECT_EQ(out.dtype(), dtype);
        expect_matches(out, shape, expected, tolerance_for(dtype),
                       str(c.name, " op ", static_cast<int>(op), " ", dtype_name(dtype)));
      }
    }
  }
}

TEST(OpForward, ArithmeticOperatorsMatchNamedOps) {
  const Tensor a = random_normal({7, 13}, 21), b = random_uniform({13}, 22, 0.5, 2);
  Shape shape;
  expect_matches(a + b, {7, 13}, binary_reference_values(BinaryOp::kAdd, a, b, &shape), kFloat32Tolerance, "a + b");
  expect_matches(a - b, {7, 13}, binary_reference_values(BinaryOp::kSub, a, b, &shape), kFloat32Tolerance, "a - b");
  expect_matches(a * b, {7, 13}, binary_reference_values(BinaryOp::kMul, a, b, &shape), kFloat32Tolerance, "a * b");
  expect_matches(a / b, {7, 13}, binary_reference_values(BinaryOp::kDiv, a, b, &shape), kFloat32Tolerance, "a / b");
}

TEST(OpForward, ScaleAddScalarNeg) {
  for (DType dtype : {kFloat32, kFloat64}) {
    // A transposed, narrowed view: [13, 7] out of [9, 13].
    const Tensor x = random_normal({9, 13}, 31, dtype).narrow(0, 1, 7).transpose(0, 1);
    const Values values = x.to_vector();
    Values scaled, shifted, negated;
    for (double v : values) {
      scaled.push_back(v * -2.5);
      shifted.push_back(v + 0.75);
      negated.push_back(-v);
    }
    const double tolerance = tolerance_for(dtype);
    expect_matches(scale(x, -2.5), {13, 7}, scaled, tolerance, "scale");
    expect_matches(x * -2.5, {13, 7}, scaled, tolerance, "x * -2.5");
    expect_matches(-2.5 * x, {13, 7}, scaled, tolerance, "-2.5 * x");
    expect_matches(add_scalar(x, 0.75), {13, 7}, shifted, tolerance, "add_scalar");
    expect_matches(neg(x), {13, 7}, negated, tolerance, "neg");
    expect_matches(-x, {13, 7}, negated, tolerance, "-x");
  }
}

double gelu_reference(double x) {
  const double inner = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(inner));
}

TEST(OpForward, UnaryOps) {
  struct UnaryCase {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*reference)(double);
    bool positive_input;
  };
  const std::vector<UnaryCase> cases = {
      {"relu", relu, [](double x) { return x > 0 ? x : 0.0; }, false},
      {"gelu", gelu, gelu_reference, false},
      {"silu", silu, [](double x) { return x / (1.0 + std::exp(-x)); }, false},
      {"exp", exp, [](double x) { return std::exp(x); }, false},
      {"log", log, [](double x) { return std::log(x); }, true},
      {"tanh", tanh, [](double x) { return std::tanh(x); }, false},
      {"sqrt", sqrt, [](double x) { return std::sqrt(x); }, true},
      {"square", square, [](double x) { return x * x; }, false},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const UnaryCase& c : cases) {
      const Tensor base = c.positive_input ? random_uniform({13, 33}, 41, 0.05, 4.0, dtype)
                                           : Tensor::normal({13, 33}, 42, 0, 0.0, 2.0, dtype);
      // Contiguous [7, 33], a transposed [33, 13] view and an expanded [3, 7, 13] view.
      const std::vector<std::pair<std::string, Tensor>> inputs = {
          {"contiguous", base.narrow(0, 0, 7).contiguous()},
          {"transposed", base.transpose(0, 1)},
          {"expanded", base.narrow(1, 5, 13).narrow(0, 2, 1).expand({3, 7, 13})},
      };
      for (const auto& [layout, x] : inputs) {
        Values expected;
        for (double v : x.to_vector()) expected.push_back(c.reference(v));
        const Tensor out = c.op(x);
        EXPECT_EQ(out.dtype(), dtype);
        expect_matches(out, x.shape(), expected, tolerance_for(dtype),
                       str(c.name, " ", layout, " ", dtype_name(dtype)));
      }
    }
  }
}

TEST(OpForward, ReluAndGeluAtKnownPoints) {
  const Tensor x = Tensor::from_vector(Values{-3.0, -1.0, 0.0, 1.0, 3.0}, {5}, kFloat64);
  expect_matches(relu(x), {5}, {0, 0, 0, 1, 3}, 0, "relu");
  // GPT-2's tanh-form gelu at 1: 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.84119199060828
  EXPECT_NEAR(gelu(x).at({3}), 0.8411919906082768, 1e-12);
  EXPECT_NEAR(gelu(x).at({2}), 0.0, 1e-15);
}

// --- Reductions ----------------------------------------------------------------------------

// sum or mean of x over `dims` (empty: all), as plain loops.
Values reduce_reference(const Tensor& x, const std::vector<int64_t>& dims_in, bool mean, Shape* kept) {
  const int64_t rank = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(rank), dims_in.empty());
  for (int64_t d : dims_in) reduced[static_cast<size_t>(d < 0 ? d + rank : d)] = true;
  *kept = x.shape();
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) {
      count *= (*kept)[d];
      (*kept)[d] = 1;
    }
  }
  Values totals(static_cast<size_t>(shape_numel(*kept)), 0.0);
  const Values values = x.to_vector();
  for (int64_t i = 0; i < x.numel(); ++i) {
    Shape index = unravel(i, x.shape());
    for (int64_t d = 0; d < rank; ++d) {
      if (reduced[d]) index[d] = 0;
    }
    totals[ravel(index, *kept)] += values[i];
  }
  if (mean) {
    for (double& t : totals) t /= static_cast<double>(count);
  }
  return totals;
}

Shape drop_ones(const Shape& kept, const Tensor& x, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool is_reduced = dims.empty();
    for (int64_t r : dims) is_reduced |= (r < 0 ? r + x.dim() : r) == d;
    if (!is_reduced) out.push_back(kept[d]);
  }
  return out;
}

TEST(OpForward, SumAndMeanOverDims) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor base = random_normal({7, 13, 5}, 51, dtype);
    const std::vector<std::pair<std::string, Tensor>> inputs = {
        {"contiguous", base},
        {"permuted", base.permute({2, 0, 1})},
        {"narrowed", base.narrow(1, 3, 9)},
        {"expanded", base.narrow(0, 4, 1).expand({3, 13, 5})},
    };
    const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {-1}, {0, 2}, {2, 0}, {0, 1, 2}, {-2, 0}};
    for (const auto& [layout, x] : inputs) {
      for (const std::vector<int64_t>& dims : dim_sets) {
        for (bool keepdim : {false, true}) {
          for (bool is_mean : {false, true}) {
            Shape kept;
            const Values expected = reduce_reference(x, dims, is_mean, &kept);
            const Tensor out = is_mean ? mean(x, dims, keepdim) : sum(x, dims, keepdim);
            const Shape expected_shape = keepdim ? kept : drop_ones(kept, x, dims);
            expect_matches(out, expected_shape, expected, tolerance_for(dtype),
                           str(is_mean ? "mean " : "sum ", layout, " dims ", shape_string(dims), " keepdim ",
                               keepdim, " ", dtype_name(dtype)));
          }
        }
      }
    }
  }
}

// (values, first index of the maximum) of x along `dim`, as plain loops.
void max_reference(const Tensor& x, int64_t dim, Values* values, std::vector<int64_t>* indices, Shape* kept) {
  *kept = x.shape();
  (*kept)[dim] = 1;
  const int64_t slots = shape_numel(*kept);
  values->assign(static_cast<size_t>(slots), -std::numeric_limits<double>::infinity());
  indices->assign(static_cast<size_t>(slots), -1);
  for (int64_t s = 0; s < slots; ++s) {
    Shape index = unravel(s, *kept);
    for (int64_t j = 0; j < x.size(dim); ++j) {
      index[dim] = j;
      const double v = x.at(index);
      if ((*indices)[s] < 0 || v > (*values)[s]) {
        (*values)[s] = v;
        (*indices)[s] = j;
      }
    }
  }
}

TEST(OpForward, MaxWithIndices) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor base = random_normal({7, 13, 5}, 61, dtype);
    const std::vector<std::pair<std::string, Tensor>> inputs = {
        {"contiguous", base},
        {"transposed", base.transpose(0, 2)},
        {"narrowed", base.narrow(1, 2, 9)},
    };
    for (const auto& [layout, x] : inputs) {
      for (int64_t dim : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          const int64_t d = dim < 0 ? dim + x.dim() : dim;
          Values values;
          std::vector<int64_t> indices;
          Shape kept;
          max_reference(x, d, &values, &indices, &kept);
          const auto [out, out_indices] = max(x, dim, keepdim);
          Shape expected_shape = kept;
          if (!keepdim) expected_shape.erase(expected_shape.begin() + d);
          const std::string what = str("max ", layout, " dim ", dim, " keepdim ", keepdim, " ", dtype_name(dtype));
          expect_matches(out, expected_shape, values, 0.0, what);
          EXPECT_EQ(out_indices.dtype(), kInt64) << what;
          ASSERT_EQ(shape_string(out_indices.shape()), shape_string(expected_shape)) << what;
          const Values got = out_indices.to_vector();
          for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], indices[i]) << what << " slot " << i;
        }
      }
    }
  }
}

TEST(OpForward, MaxTiesPickTheFirstIndex) {
  // Rows with repeated maxima; the first occurrence wins, also through a transposed view.
  const Tensor x = Tensor::from_vector(Values{1, 3, 3, 2,  //
                                              5, 5, 5, 5,  //
                                              -1, -2, -1, -3,  //
                                              0, 5, 7, 7},
                                       {4, 4});
  const auto [values, indices] = max(x, 1);
  EXPECT_EQ(values.to_vector(), (Values{3, 5, -1, 7}));
  EXPECT_EQ(indices.to_vector(), (Values{1, 0, 0, 2}));
  const auto [values_t, indices_t] = max(x.transpose(0, 1), 0);  // the same rows, read down columns
  EXPECT_EQ(values_t.to_vector(), (Values{3, 5, -1, 7}));
  EXPECT_EQ(indices_t.to_vector(), (Values{1, 0, 0, 2}));
  const auto [column_values, column_indices] = max(x, 0, /*keepdim=*/true);
  EXPECT_EQ(shape_string(column_values.shape()), "[1, 4]");
  EXPECT_EQ(column_values.to_vector(), (Values{5, 5, 7, 7}));
  EXPECT_EQ(column_indices.to_vector(), (Values{1, 1, 3, 3}));  // column 1 ties at rows 1 and 3
}

// --- Matmul and linear ---------------------------------------------------------------------

// a [..., M, K] @ b [..., K, N] with broadcast batch dims, by triple loops read through at().
Values matmul_reference(const Tensor& a, const Tensor& b, Shape* out_shape) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_reference_shape(a_batch, b_batch);
  *out_shape = batch;
  out_shape->push_back(m);
  out_shape->push_back(n);
  const Values a_values = a.to_vector(), b_values = b.to_vector();
  Values out;
  for (int64_t batch_index = 0; batch_index < shape_numel(batch); ++batch_index) {
    const Shape index = unravel(batch_index, batch);
    const int64_t a_base = ravel(broadcast_source(index, a_batch), a_batch) * m * k;
    const int64_t b_base = ravel(broadcast_source(index, b_batch), b_batch) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double total = 0;
        for (int64_t p = 0; p < k; ++p) total += a_values[a_base + i * k + p] * b_values[b_base + p * n + j];
        out.push_back(total);
      }
    }
  }
  return out;
}

TEST(OpForward, MatmulShapesAndLayouts) {
  for (DType dtype : {kFloat32, kFloat64}) {
    struct MatmulCase {
      std::string name;
      Tensor a, b;
    };
    const std::vector<MatmulCase> cases = {
        {"[13, 7] x [7, 33]", random_normal({13, 7}, 71, dtype), random_normal({7, 33}, 72, dtype)},
        {"batched [3, 13, 7] x [3, 7, 33]", random_normal({3, 13, 7}, 73, dtype), random_normal({3, 7, 33}, 74, dtype)},
        {"broadcast batch [2, 1, 5, 7] x [3, 7, 4]", random_normal({2, 1, 5, 7}, 75, dtype),
         random_normal({3, 7, 4}, 76, dtype)},
        {"3-D x shared 2-D", random_normal({4, 5, 7}, 77, dtype), random_normal({7, 6}, 78, dtype)},
        {"2-D x 3-D", random_normal({5, 7}, 79, dtype), random_normal({4, 7, 6}, 80, dtype)},
        {"transposed a", random_normal({7, 13}, 81, dtype).transpose(0, 1), random_normal({7, 33}, 82, dtype)},
        {"transposed b", random_normal({13, 7}, 83, dtype), random_normal({33, 7}, 84, dtype).transpose(0, 1)},
        {"both transposed", random_normal({7, 13}, 85, dtype).transpose(0, 1),
         random_normal({33, 7}, 86, dtype).transpose(0, 1)},
        {"batched transposed", random_normal({3, 7, 13}, 87, dtype).transpose(-1, -2),
         random_normal({3, 33, 7}, 88, dtype).transpose(-1, -2)},
        {"K = 1", random_normal({13, 1}, 89, dtype), random_normal({1, 33}, 90, dtype)},
        {"K = 1 transposed", random_normal({1, 13}, 91, dtype).transpose(0, 1),
         random_normal({33, 1}, 92, dtype).transpose(0, 1)},
        {"M = 1 and N = 1", random_normal({1, 7}, 93, dtype), random_normal({7, 1}, 94, dtype)},
        {"narrowed columns", random_normal({13, 10}, 95, dtype).narrow(1, 2, 7),
         random_normal({9, 40}, 96, dtype).narrow(0, 1, 7).narrow(1, 3, 33)},
        {"expanded batch operand", random_normal({3, 13, 7}, 97, dtype),
         random_normal({1, 7, 33}, 98, dtype).expand({3, 7, 33})},
        {"permuted batch dim", random_normal({13, 3, 7}, 103, dtype).permute({1, 0, 2}),
         random_normal({7, 3, 33}, 104, dtype).permute({1, 0, 2})},
        {"stride-0 rows and columns", random_normal({13, 1}, 105, dtype).expand({13, 7}),
         random_normal({1, 33}, 106, dtype).expand({7, 33})},
        {"narrowed batch", random_normal({5, 13, 7}, 107, dtype).narrow(0, 1, 3),
         random_normal({4, 7, 33}, 108, dtype).narrow(0, 1, 3)},
        {"3-D x transposed 2-D (linear layout)", random_normal({2, 13, 7}, 99, dtype),
         random_normal({33, 7}, 100, dtype).transpose(0, 1)},
        {"transposed 3-D x 2-D", random_normal({2, 7, 13}, 101, dtype).transpose(1, 2),
         random_normal({7, 33}, 102, dtype)},
    };
    for (const MatmulCase& c : cases) {
      Shape shape;
      const Values expected = matmul_reference(c.a, c.b, &shape);
      expect_matches(matmul(c.a, c.b), shape, expected, tolerance_for(dtype),
                     str("matmul ", c.name, " ", dtype_name(dtype)));
    }
  }
}

// x [..., In] weight [Out, In] + bias [Out].
Values linear_reference(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  const Values xv = x.to_vector(), wv = weight.to_vector();
  const Values bv = bias.defined() ? bias.to_vector() : Values(static_cast<size_t>(out), 0.0);
  Values result;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double total = bv[o];
      for (int64_t i = 0; i < in; ++i) total += xv[r * in + i] * wv[o * in + i];
      result.push_back(total);
    }
  }
  return result;
}

TEST(OpForward, LinearWithAndWithoutBias) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor x = random_normal({2, 5, 7}, 111, dtype), weight = random_normal({9, 7}, 112, dtype);
    const Tensor bias = random_normal({9}, 113, dtype);
    const double tolerance = tolerance_for(dtype);
    expect_matches(linear(x, weight, bias), {2, 5, 9}, linear_reference(x, weight, bias), tolerance, "linear bias");
    expect_matches(linear(x, weight), {2, 5, 9}, linear_reference(x, weight, Tensor()), tolerance, "linear");
    const Tensor vector = random_normal({7}, 114, dtype);
    expect_matches(linear(vector, weight, bias), {9}, linear_reference(vector, weight, bias), tolerance,
                   "linear 1-D input");
    // A transposed input and a weight given as the transpose of an [In, Out] tensor.
    const Tensor xt = random_normal({7, 13}, 115, dtype).transpose(0, 1);
    const Tensor wt = random_normal({7, 9}, 116, dtype).transpose(0, 1);
    expect_matches(linear(xt, wt, bias), {13, 9}, linear_reference(xt, wt, bias), tolerance, "linear views");
  }
}

// --- Softmax -------------------------------------------------------------------------------

// softmax (or log-softmax) of x along `dim`, as plain loops with the row maximum subtracted.
Values softmax_reference(const Tensor& x, int64_t dim, bool log) {
  if (dim < 0) dim += x.dim();
  const Values values = x.to_vector();
  Values out(values.size());
  Shape kept = x.shape();
  kept[dim] = 1;
  for (int64_t s = 0; s < shape_numel(kept); ++s) {
    Shape index = unravel(s, kept);
    double maximum = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < x.size(dim); ++j) {
      index[dim] = j;
      maximum = std::max(maximum, values[ravel(index, x.shape())]);
    }
    double total = 0;
    for (int64_t j = 0; j < x.size(dim); ++j) {
      index[dim] = j;
      total += std::exp(values[ravel(index, x.shape())] - maximum);
    }
    for (int64_t j = 0; j < x.size(dim); ++j) {
      index[dim] = j;
      const int64_t at = ravel(index, x.shape());
      const double shifted = values[at] - maximum;
      out[at] = log ? shifted - std::log(total) : std::exp(shifted) / total;
    }
  }
  return out;
}

TEST(OpForward, SoftmaxAndLogSoftmaxAlongDims) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor base = Tensor::normal({3, 13, 7}, 121, 0, 0.0, 3.0, dtype);
    const std::vector<std::pair<std::string, Tensor>> inputs = {
        {"contiguous", base},
        {"transposed", base.transpose(1, 2)},
        {"narrowed", base.narrow(1, 2, 9)},
        {"expanded", base.narrow(0, 1, 1).expand({4, 13, 7})},
    };
    for (const auto& [layout, x] : inputs) {
      for (int64_t dim : {-1, 0, 1, 2}) {
        for (bool log : {false, true}) {
          const Tensor out = log ? log_softmax(x, dim) : softmax(x, dim);
          expect_matches(out, x.shape(), softmax_reference(x, dim, log), tolerance_for(dtype),
                         str(log ? "log_softmax " : "softmax ", layout, " dim ", dim, " ", dtype_name(dtype)));
        }
      }
    }
  }
}

TEST(OpForward, SoftmaxOfLargeLogitsDoesNotOverflow) {
  for (DType dtype : {kFloat32, kFloat64}) {
    // Logits around +1e4 and -1e4 (exp overflows without the max subtraction).
    Tensor x = Tensor::normal({5, 13}, 131, 0, 1e4, 1.0, dtype);
    for (int64_t c = 0; c < 13; c += 3) x.set({2, c}, -1e4);
    x.set({4, 6}, 1e4 + 50);
    for (int64_t dim : {-1, 0}) {
      for (bool log : {false, true}) {
        const Tensor out = log ? log_softmax(x, dim) : softmax(x, dim);
        const std::string what = str(log ? "log_softmax" : "softmax", " large dim ", dim, " ", dtype_name(dtype));
        const Values expected = softmax_reference(x, dim, log);
        expect_matches(out, x.shape(), expected, tolerance_for(dtype), what);
        for (double value : out.to_vector()) ASSERT_TRUE(std::isfinite(value)) << what;
      }
    }
  }
}

// --- Normalization -------------------------------------------------------------------------

Values layer_norm_reference(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t columns = x.size(-1), rows = x.numel() / columns;
  const Values xv = x.to_vector(), wv = weight.to_vector();
  const Values bv = bias.defined() ? bias.to_vector() : Values(static_cast<size_t>(columns), 0.0);
  Values out;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0;
    for (int64_t c = 0; c < columns; ++c) mean += xv[r * columns + c];
    mean /= static_cast<double>(columns);
    double variance = 0;
    for (int64_t c = 0; c < columns; ++c) variance += (xv[r * columns + c] - mean) * (xv[r * columns + c] - mean);
    variance /= static_cast<double>(columns);
    const double rstd = 1.0 / std::sqrt(variance + eps);
    for (int64_t c = 0; c < columns; ++c) out.push_back((xv[r * columns + c] - mean) * rstd * wv[c] + bv[c]);
  }
  return out;
}

Values rms_norm_reference(const Tensor& x, const Tensor& weight, double eps) {
  const int64_t columns = x.size(-1), rows = x.numel() / columns;
  const Values xv = x.to_vector(), wv = weight.to_vector();
  Values out;
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int64_t c = 0; c < columns; ++c) squares += xv[r * columns + c] * xv[r * columns + c];
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(columns) + eps);
    for (int64_t c = 0; c < columns; ++c) out.push_back(xv[r * columns + c] * rstd * wv[c]);
  }
  return out;
}

TEST(OpForward, LayerNormAndRmsNorm) {
  for (DType dtype : {kFloat32, kFloat64}) {
    // Rows with an offset mean, so a one-pass variance would lose precision.
    const Tensor base = Tensor::normal({3, 5, 33}, 141, 0, 3.0, 2.0, dtype);
    const Tensor weight = random_normal({33}, 142, dtype), bias = random_normal({33}, 143, dtype);
    // A strided weight: column 1 of a [33, 2] tensor.
    const Tensor strided_weight = random_normal({33, 2}, 144, dtype).select(1, 1);
    const std::vector<std::pair<std::string, Tensor>> inputs = {
        {"contiguous", base},
        {"transposed", random_normal({33, 7}, 145, dtype).transpose(0, 1)},
        {"narrowed", random_normal({7, 40}, 146, dtype).narrow(1, 4, 33)},
        {"expanded", base.narrow(0, 0, 1).expand({2, 5, 33})},
    };
    for (const auto& [layout, x] : inputs) {
      const std::string what = str(layout, " ", dtype_name(dtype));
      const double tolerance = tolerance_for(dtype);
      expect_matches(layer_norm(x, weight, bias), x.shape(), layer_norm_reference(x, weight, bias, 1e-5), tolerance,
                     "layer_norm with bias " + what);
      expect_matches(layer_norm(x, weight, Tensor(), 1e-3), x.shape(),
                     layer_norm_reference(x, weight, Tensor(), 1e-3), tolerance, "layer_norm no bias " + what);
      expect_matches(layer_norm(x, strided_weight, bias), x.shape(),
                     layer_norm_reference(x, strided_weight, bias, 1e-5), tolerance, "layer_norm strided weight " + what);
      expect_matches(rms_norm(x, weight), x.shape(), rms_norm_reference(x, weight, 1e-6), tolerance,
                     "rms_norm " + what);
      expect_matches(rms_norm(x, strided_weight, 1e-2), x.shape(), rms_norm_reference(x, strided_weight, 1e-2),
                     tolerance, "rms_norm strided weight " + what);
    }
  }
}

// --- Embedding -----------------------------------------------------------------------------

TEST(OpForward, EmbeddingWithInt32AndInt64Ids) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor weight = random_normal({11, 5}, 151, dtype);
    const std::vector<int64_t> id_values = {3, 0, 10, 3, 7, 1};
    for (DType id_dtype : {kInt32, kInt64}) {
      const Tensor ids = Tensor::from_vector(absl::Span<const int64_t>(id_values), {2, 3}, id_dtype);
      ASSERT_EQ(ids.dtype(), id_dtype);
      const std::vector<std::pair<std::string, Tensor>> id_layouts = {{"[2, 3]", ids}, {"transposed", ids.transpose(0, 1)}};
      for (const auto& [layout, id_view] : id_layouts) {
        Shape expected_shape = id_view.shape();
        expected_shape.push_back(5);
        Values expected;
        for (double id : id_view.to_vector()) {
          for (int64_t c = 0; c < 5; ++c) expected.push_back(weight.at({static_cast<int64_t>(id), c}));
        }
        expect_matches(embedding(id_view, weight), expected_shape, expected, 0.0,
                       str("embedding ", dtype_name(id_dtype), " ", layout, " ", dtype_name(dtype)));
      }
    }
    // A transposed (non-contiguous) weight table.
    const Tensor table = random_normal({5, 11}, 152, dtype).transpose(0, 1);
    const Tensor ids = Tensor::from_vector(std::vector<int64_t>{10, 0, 4}, {3});
    Values expected;
    for (int64_t id : {10, 0, 4}) {
      for (int64_t c = 0; c < 5; ++c) expected.push_back(table.at({id, c}));
    }
    expect_matches(embedding(ids, table), {3, 5}, expected, 0.0, "embedding transposed table");
  }
}

// --- Attention -----------------------------------------------------------------------------

// Naive causal attention: full score rows with -inf above the diagonal, softmax, weighted sum.
Values attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), dim = q.size(3);
  const Values qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  Values out(qv.size(), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (b * heads + h) * steps * dim;
      for (int64_t t = 0; t < steps; ++t) {
        Values scores(static_cast<size_t>(steps));
        double maximum = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < steps; ++s) {
          if (s > t) {
            scores[s] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += qv[base + t * dim + d] * kv[base + s * dim + d];
          scores[s] = dot * scale;
          maximum = std::max(maximum, scores[s]);
        }
        double total = 0;
        for (int64_t s = 0; s < steps; ++s) total += std::exp(scores[s] - maximum);
        for (int64_t s = 0; s < steps; ++s) {
          const double weight = std::exp(scores[s] - maximum) / total;
          for (int64_t d = 0; d < dim; ++d) out[base + t * dim + d] += weight * vv[base + s * dim + d];
        }
      }
    }
  }
  return out;
}

TEST(OpForward, CausalAttention) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const int64_t batch = 2, heads = 3, steps = 9, dim = 5;
    const Tensor q = random_normal({batch, heads, steps, dim}, 161, dtype);
    const Tensor k = random_normal({batch, heads, steps, dim}, 162, dtype);
    const Tensor v = random_normal({batch, heads, steps, dim}, 163, dtype);
    const double tolerance = tolerance_for(dtype);
    const Tensor out = causal_attention(q, k, v);
    expect_matches(out, q.shape(), attention_reference(q, k, v, 1.0 / std::sqrt(5.0)), tolerance,
                   str("attention default scale ", dtype_name(dtype)));
    // Position 0 attends only to itself: its output is v[..., 0, :] exactly.
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          EXPECT_EQ(out.at({b, h, 0, d}), v.at({b, h, 0, d})) << "b " << b << " h " << h << " d " << d;
        }
      }
    }
    expect_matches(causal_attention(q, k, v, 0.3), q.shape(), attention_reference(q, k, v, 0.3), tolerance,
                   str("attention scale 0.3 ", dtype_name(dtype)));
    // q, k, v as [B, T, H, D] tensors permuted to [B, H, T, D] (the layout a QKV projection gives).
    const Tensor qp = random_normal({batch, steps, heads, dim}, 164, dtype).permute({0, 2, 1, 3});
    const Tensor kp = random_normal({batch, steps, heads, dim}, 165, dtype).permute({0, 2, 1, 3});
    const Tensor vp = random_normal({batch, steps, heads, dim}, 166, dtype).permute({0, 2, 1, 3});
    expect_matches(causal_attention(qp, kp, vp), qp.shape(), attention_reference(qp, kp, vp, 1.0 / std::sqrt(5.0)),
                   tolerance, str("attention permuted inputs ", dtype_name(dtype)));
    // The output is stored in [B, T, H, D] order, so merging its heads is a view.
    EXPECT_TRUE(out.permute({0, 2, 1, 3}).is_contiguous()) << out.describe();
  }
}

// --- Cross-entropy -------------------------------------------------------------------------

double cross_entropy_reference(const Tensor& logits, const std::vector<int64_t>& targets, int64_t ignore_index) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const Values lv = logits.to_vector();
  double total = 0;
  int64_t counted = 0;
  for (int64_t n = 0; n < rows; ++n) {
    if (targets[n] == ignore_index) continue;
    double maximum = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < classes; ++c) maximum = std::max(maximum, lv[n * classes + c]);
    double sum_exp = 0;
    for (int64_t c = 0; c < classes; ++c) sum_exp += std::exp(lv[n * classes + c] - maximum);
    total += maximum + std::log(sum_exp) - lv[n * classes + targets[n]];
    ++counted;
  }
  return counted == 0 ? 0.0 : total / static_cast<double>(counted);
}

TEST(OpForward, CrossEntropyWithIgnoredRows) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor logits = Tensor::normal({13, 7}, 171, 0, 0.0, 2.0, dtype);
    const std::vector<int64_t> targets = {2, -100, 6, 0, -100, 3, 3, 1, 5, -100, 4, 0, 6};
    for (DType target_dtype : {kInt32, kInt64}) {
      const Tensor t = Tensor::from_vector(absl::Span<const int64_t>(targets), {13}, target_dtype);
      const std::string what = str("cross_entropy ", dtype_name(dtype), " targets ", dtype_name(target_dtype));
      const Tensor loss = cross_entropy(logits, t);
      EXPECT_EQ(loss.numel(), 1) << what;
      expect_matches(loss.reshape({1}), {1}, {cross_entropy_reference(logits, targets, -100)}, tolerance_for(dtype),
                     what);
    }
    // A custom ignore_index, and transposed logits.
    const std::vector<int64_t> custom = {1, 4, 4, 0, 2, 4, 6};
    const Tensor transposed = Tensor::normal({7, 7}, 172, 0, 0.0, 2.0, dtype).transpose(0, 1);
    const Tensor custom_targets = Tensor::from_vector(absl::Span<const int64_t>(custom), {7});
    expect_matches(cross_entropy(transposed, custom_targets, 4).reshape({1}), {1},
                   {cross_entropy_reference(transposed, custom, 4)}, tolerance_for(dtype),
                   "cross_entropy ignore_index 4 transposed");
    // Every row ignored: the loss is 0 (not NaN from 0 / 0).
    const Tensor all_ignored = Tensor::from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
    const Tensor zero_loss = cross_entropy(logits.narrow(0, 0, 3), all_ignored);
    EXPECT_EQ(zero_loss.item(), 0.0) << dtype_name(dtype);
  }
}

TEST(OpForward, CrossEntropyOfLargeLogitsIsFinite) {
  Tensor logits = Tensor::normal({4, 9}, 173, 0, 1e4, 10.0);
  const std::vector<int64_t> targets = {0, 8, 4, 2};
  const Tensor loss = cross_entropy(logits, Tensor::from_vector(absl::Span<const int64_t>(targets), {4}));
  ASSERT_TRUE(std::isfinite(loss.item()));
  // The logits differ by ~10 at ~1e4 magnitude: f32 holds them to ~1e-3, so compare absolutely.
  EXPECT_NEAR(loss.item(), cross_entropy_reference(logits, targets, -100), 1e-2);
}

// --- Dropout -------------------------------------------------------------------------------

TEST(OpForward, DropoutKeepsAboutOneMinusPAndScales) {
  const double p = 0.3;
  const Tensor x = random_normal({100, 100}, 181);  // 10k elements
  const Values input = x.to_vector();
  const Values out = dropout(x, p, /*seed=*/7, /*offset=*/0).to_vector();
  int64_t kept = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0.0 && input[i] != 0.0) continue;
    ++kept;
    EXPECT_NEAR(out[i], input[i] / (1.0 - p), 1e-5 * std::max(1.0, std::fabs(input[i]))) << "element " << i;
  }
  const double fraction = static_cast<double>(kept) / 10000.0;
  // The binomial standard deviation is sqrt(0.3 * 0.7 / 1e4) = 0.0046; allow about 5 of them.
  EXPECT_NEAR(fraction, 1.0 - p, 0.025);
}

TEST(OpForward, DropoutMaskFollowsThePhiloxContract) {
  // Element i is kept exactly when Philox uniform(seed, offset + i) >= p (runtime/random.h).
  const double p = 0.4;
  const Tensor x = Tensor::ones({33, 13});
  for (uint64_t offset : {0ull, 5ull, 1000003ull}) {
    const Values out = dropout(x, p, 11, offset).to_vector();
    for (size_t i = 0; i < out.size(); ++i) {
      const bool keep = philox_uniform(11, offset + i) >= p;
      ASSERT_EQ(out[i], keep ? static_cast<double>(static_cast<float>(1.0 / (1.0 - p))) : 0.0)
          << "offset " << offset << " element " << i;
    }
  }
}

TEST(OpForward, DropoutIsDeterministicPerSeedAndOffset) {
  const Tensor x = Tensor::ones({100, 100});
  const Values first = dropout(x, 0.5, 3, 17).to_vector();
  const Values again = dropout(x, 0.5, 3, 17).to_vector();
  EXPECT_EQ(first, again);
  const Values shifted = dropout(x, 0.5, 3, 18).to_vector();
  const Values reseeded = dropout(x, 0.5, 4, 17).to_vector();
  int64_t differ_offset = 0, differ_seed = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    differ_offset += first[i] != shifted[i];
    differ_seed += first[i] != reseeded[i];
  }
  // Independent masks at p = 0.5 disagree on about half the elements.
  EXPECT_GT(differ_offset, 4000);
  EXPECT_GT(differ_seed, 4000);
  // The counter is offset + i, so offset 18 is offset 17 shifted by one element.
  for (size_t i = 0; i + 1 < first.size(); ++i) ASSERT_EQ(shifted[i], first[i + 1]) << i;
}

TEST(OpForward, DropoutIdentityWhenNotTrainingOrPZero) {
  const Tensor x = random_normal({7, 13}, 191).transpose(0, 1);
  const Tensor eval = dropout(x, 0.5, 1, 0, /*training=*/false);
  EXPECT_EQ(shape_string(eval.shape()), "[13, 7]");
  EXPECT_EQ(eval.to_vector(), x.to_vector());
  EXPECT_EQ(dropout(x, 0.0, 1, 0).to_vector(), x.to_vector());
  // Non-contiguous input in training mode: the mask follows row-major logical order.
  const Values out = dropout(x, 0.25, 1, 0).to_vector();
  const Values input = x.to_vector();
  for (size_t i = 0; i < out.size(); ++i) {
    const bool keep = philox_uniform(1, i) >= 0.25;
    EXPECT_NEAR(out[i], keep ? input[i] / 0.75 : 0.0, 1e-5) << i;
  }
}

// --- Concat and split ----------------------------------------------------------------------

TEST(OpForward, ConcatAndSplitRoundTrip) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor a = random_normal({3, 4, 5}, 201, dtype);
    const Tensor b = random_normal({3, 2, 5}, 202, dtype);
    const Tensor c = random_normal({5, 7, 3}, 203, dtype).permute({2, 1, 0}).narrow(1, 1, 5).narrow(2, 0, 5);
    ASSERT_EQ(shape_string(c.shape()), "[3, 5, 5]");
    for (int64_t dim : {1, -2}) {
      const Tensor joined = concat({a, b, c}, dim);
      ASSERT_EQ(shape_string(joined.shape()), "[3, 11, 5]");
      // Reference: element (i, j, l) comes from a, b or c by the range of j.
      Values expected;
      for (int64_t i = 0; i < 3; ++i) {
        for (int64_t j = 0; j < 11; ++j) {
          for (int64_t l = 0; l < 5; ++l) {
            expected.push_back(j < 4 ? a.at({i, j, l}) : j < 6 ? b.at({i, j - 4, l}) : c.at({i, j - 6, l}));
          }
        }
      }
      expect_matches(joined, {3, 11, 5}, expected, 0.0, str("concat dim ", dim));
      const std::vector<Tensor> pieces = split(joined, {4, 2, 5}, dim);
      ASSERT_EQ(pieces.size(), 3u);
      expect_matches(pieces[0], a.shape(), a.to_vector(), 0.0, "split piece 0");
      expect_matches(pieces[1], b.shape(), b.to_vector(), 0.0, "split piece 1");
      expect_matches(pieces[2], c.shape(), c.to_vector(), 0.0, "split piece 2");
    }
    // Along dim 0, with an empty piece.
    const Tensor d = random_normal({2, 4, 5}, 204, dtype);
    const Tensor rows = concat({a, d}, 0);
    Values expected = a.to_vector();
    for (double value : d.to_vector()) expected.push_back(value);
    expect_matches(rows, {5, 4, 5}, expected, 0.0, "concat dim 0");
    const std::vector<Tensor> parts = split(rows, {3, 0, 2}, 0);
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[1].numel(), 0);
    expect_matches(parts[0], {3, 4, 5}, a.to_vector(), 0.0, "split dim 0 piece 0");
    expect_matches(parts[2], {2, 4, 5}, d.to_vector(), 0.0, "split dim 0 piece 2");
  }
}

// --- Degenerate shapes ---------------------------------------------------------------------

TEST(OpForward, ScalarsConstantRowsAndEmptyDims) {
  // A constant row has zero variance: layer_norm gives the bias, rms_norm of zeros gives zeros.
  const Tensor constant = Tensor::full({2, 7}, 3.5);
  const Tensor weight = random_normal({7}, 241), bias = random_normal({7}, 242);
  Values expected;
  for (int64_t r = 0; r < 2; ++r) {
    for (double b : bias.to_vector()) expected.push_back(b);
  }
  expect_matches(layer_norm(constant, weight, bias), {2, 7}, expected, kFloat32Tolerance, "layer_norm constant rows");
  expect_matches(rms_norm(Tensor::zeros({2, 7}), weight), {2, 7}, Values(14, 0.0), 0.0, "rms_norm zeros");
  // 0-d inputs.
  const Tensor scalar = Tensor::scalar(-1.25);
  expect_matches(softmax(scalar).reshape({1}), {1}, {1.0}, 0.0, "softmax of a scalar");
  expect_matches(log_softmax(scalar).reshape({1}), {1}, {0.0}, 0.0, "log_softmax of a scalar");
  expect_matches(sum(scalar).reshape({1}), {1}, {-1.25}, 0.0, "sum of a scalar");
  expect_matches(relu(scalar).reshape({1}), {1}, {0.0}, 0.0, "relu of a scalar");
  const Tensor table = random_normal({4, 3}, 243);
  expect_matches(embedding(Tensor::from_vector(std::vector<int64_t>{2}, {}), table), {3},
                 {table.at({2, 0}), table.at({2, 1}), table.at({2, 2})}, 0.0, "embedding of a 0-d id");
  // An empty inner dim gives a zero product; an empty reduced dim gives a zero sum.
  expect_matches(matmul(Tensor::ones({3, 0}), Tensor::ones({0, 4})), {3, 4}, Values(12, 0.0), 0.0, "matmul K = 0");
  expect_matches(sum(Tensor::ones({0, 3}), {0}), {3}, Values(3, 0.0), 0.0, "sum over an empty dim");
  expect_matches(add(Tensor::ones({0, 3}), Tensor::ones({3})), {0, 3}, Values{}, 0.0, "add with an empty dim");
}

// --- Mixed storage (bf16, f16) -------------------------------------------------------------

// Runs `op` on 16-bit copies of the inputs and compares with the same op in f32 on those rounded
// values widened back, so the comparison measures the kernel's 16-bit path, not input rounding.
void expect_half_matches_float(const std::string& name, const std::vector<Tensor>& inputs,
                               const std::function<Tensor(const std::vector<Tensor>&)>& op,
                               bool output_keeps_dtype = true) {
  for (DType half : {kBFloat16, kFloat16}) {
    std::vector<Tensor> half_inputs, float_inputs;
    for (const Tensor& input : inputs) {
      if (!input.defined() || !is_floating(input.dtype())) {
        half_inputs.push_back(input);
        float_inputs.push_back(input);
        continue;
      }
      half_inputs.push_back(input.to(half));
      float_inputs.push_back(half_inputs.back().to(kFloat32));
    }
    const std::string what = str(name, " ", dtype_name(half));
    const Tensor half_out = op(half_inputs);
    if (output_keeps_dtype) EXPECT_EQ(half_out.dtype(), half) << what;
    const Tensor float_out = op(float_inputs);
    expect_no_nan(half_out, what);
    expect_matches(half_out, float_out.shape(), float_out.to_vector(), kHalfTolerance, what);
  }
}

TEST(OpForward, MixedStorageMatchesFloat32) {
  expect_half_matches_float("add", {random_normal({7, 13}, 211), random_normal({13}, 212)},
                            [](const std::vector<Tensor>& in) { return add(in[0], in[1]); });
  expect_half_matches_float("gelu", {Tensor::normal({13, 33}, 213, 0, 0.0, 3.0)},
                            [](const std::vector<Tensor>& in) { return gelu(in[0]); });
  expect_half_matches_float("matmul", {random_normal({3, 13, 33}, 214), random_normal({33, 7}, 215)},
                            [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); });
  expect_half_matches_float("matmul transposed",
                            {random_normal({13, 33}, 216), random_normal({7, 33}, 217)},
                            [](const std::vector<Tensor>& in) { return matmul(in[0], in[1].transpose(0, 1)); });
  expect_half_matches_float(
      "layer_norm", {Tensor::normal({5, 33}, 218, 0, 1.0, 2.0), random_normal({33}, 219), random_normal({33}, 220)},
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); });
  expect_half_matches_float("softmax", {Tensor::normal({7, 33}, 221, 0, 0.0, 3.0)},
                            [](const std::vector<Tensor>& in) { return softmax(in[0]); });
  expect_half_matches_float("softmax dim 0", {Tensor::normal({7, 33}, 222, 0, 0.0, 3.0)},
                            [](const std::vector<Tensor>& in) { return softmax(in[0], 0); });
  expect_half_matches_float(
      "causal_attention",
      {random_normal({2, 3, 9, 5}, 223), random_normal({2, 3, 9, 5}, 224), random_normal({2, 3, 9, 5}, 225)},
      [](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2]); });
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{2, -100, 6, 0, 5, 1, 3}, {7});
  expect_half_matches_float(
      "cross_entropy", {Tensor::normal({7, 9}, 226, 0, 0.0, 2.0), targets},
      [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]).reshape({1}); },
      /*output_keeps_dtype=*/false);
}

TEST(OpForward, MixedStorageAgainstDoubleReference) {
  // The 16-bit results also stay within 1e-2 of the plain-loop reference on the rounded inputs.
  for (DType half : {kBFloat16, kFloat16}) {
    const Tensor a = random_normal({13, 7}, 231).to(half), b = random_normal({7, 33}, 232).to(half);
    Shape shape;
    const Values expected = matmul_reference(a, b, &shape);
    expect_matches(matmul(a, b), shape, expected, kHalfTolerance, str("matmul ", dtype_name(half)));
    const Tensor x = Tensor::normal({5, 33}, 233, 0, 0.0, 3.0).to(half);
    expect_matches(softmax(x), x.shape(), softmax_reference(x, -1, false), kHalfTolerance,
                   str("softmax ", dtype_name(half)));
    expect_matches(gelu(x), x.shape(),
                   [&] {
                     Values out;
                     for (double v : x.to_vector()) out.push_back(gelu_reference(v));
                     return out;
                   }(),
                   kHalfTolerance, str("gelu ", dtype_name(half)));
  }
}

}  // namespace
}  // namespace weft
