// Layout transitions (parallel/tensor/layout_transition.h) under mpirun -np 2 and -np 4, on the world
// group and (at 4 ranks) on the tp groups of a dp = 2 x tp = 2 mesh, on the caller stream and on a
// communication thread.
//
// Every rank builds the same full tensor from every rank's rank-dependent data (a Partial tensor is
// the sum of every rank's piece), so the expected result of a transition is this rank's part of the
// full tensor in the target layout. Backward (f64): each rank's loss is sum(y * w) with w this rank's
// part of a fixed random weight in the layout the gradient arrives in, so the global loss is
// L = sum(Y * W) over the full tensors; the input's gradient must be W in the gradient layout of the
// input (the one-process gradient, or its shard), and finite differences of L over every rank's
// input elements must agree with it.
//
// Assertions that could stop one rank early use EXPECT (or come after the last collective), so that a
// failure on one rank never leaves the others waiting in a collective.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "parallel/mesh.h"
#include "parallel/tensor/layout_transition.h"
#include "parallel/tensor/sharding.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/reduction.h"
#include "tests/support/error_expectations.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

const Layout kReplicate = Layout::replicate();
const Layout kPartial = Layout::partial();
Layout split(int64_t dim) { return Layout::split(dim); }

enum class GroupKind { kWorld, kMeshTensorAxis };

// Small integers (|v| <= 5): sums of up to four are exact in every dtype, bf16 included.
Tensor integer_tensor(const Shape& shape, int64_t seed, DType dtype) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>((seed * 7 + static_cast<int64_t>(i) * 3) % 11) - 5;
  return Tensor::from_vector(absl::Span<const double>(values), shape, dtype);
}

Tensor sum_of(const std::vector<Tensor>& pieces) {
  autograd::NoGradGuard no_grad;
  Tensor total = pieces[0].to(kFloat64);
  for (size_t i = 1; i < pieces.size(); ++i) total = total + pieces[i].to(kFloat64);
  return total.to(pieces[0].dtype());
}

// This rank's tensor of a full tensor laid out as `layout`: the full tensor, its shard, or (Partial)
// this rank's piece of `pieces`, which sum to the full tensor.
Tensor local_of(const Tensor& full, const std::vector<Tensor>& pieces, const Layout& layout, int rank, int size) {
  if (layout.is_partial()) return pieces[static_cast<size_t>(rank)].clone();
  return shard_of(full, layout, rank, size);
}

// Shape first, so that a wrong shape is a failure rather than an exception on one rank.
void expect_equal(const Tensor& actual, const Tensor& expected, const std::string& what, double tolerance = 0.0) {
  ASSERT_EQ(shape_string(actual.shape()), shape_string(expected.shape())) << what;
  EXPECT_LE(testing::max_abs_difference(actual.to(kFloat64), expected.to(kFloat64)), tolerance) << what;
}

std::string describe(const Layout& from, const Layout& to) { return from.to_string() + " -> " + to.to_string(); }

bool is_identity(const Layout& from, const Layout& to, int64_t rank) {
  if (from.kind != to.kind) return false;
  if (!from.is_split()) return true;
  return normalize_dim(from.dim, rank, "test") == normalize_dim(to.dim, rank, "test");
}

class LayoutTransitions : public ::testing::TestWithParam<std::tuple<bool /* on a comm thread */, GroupKind>> {
 protected:
  void SetUp() override {
    const GroupKind kind = std::get<1>(GetParam());
    if (kind == GroupKind::kMeshTensorAxis) {
      if (mpi_world_size() != 4) GTEST_SKIP() << "the dp = 2 x tp = 2 mesh needs 4 ranks";
      const Mesh mesh(2, 1, 2, 4);
      tp.group = make_process_group(mesh, Axis::kTensor, Device::cpu());
      // The two tp groups hold different data, so a result taken from the wrong group shows.
      seed = 100 * (1 + mesh.group_index(Axis::kTensor, mpi_world_rank()));
    } else {
      tp.group = make_world_process_group(Device::cpu());
    }
    tp.stream = std::get<0>(GetParam()) ? CommStream::cpu("tp_comm") : CommStream();
    ASSERT_GT(tp.size(), 1);
  }

  // Every rank's piece of a Partial tensor, and their sum.
  std::vector<Tensor> integer_pieces(const Shape& shape, DType dtype) const {
    std::vector<Tensor> pieces;
    for (int r = 0; r < tp.size(); ++r) pieces.push_back(integer_tensor(shape, seed + r, dtype));
    return pieces;
  }
  std::vector<Tensor> random_pieces(const Shape& shape, uint64_t offset) const {
    std::vector<Tensor> pieces;
    for (int r = 0; r < tp.size(); ++r) {
      pieces.push_back(Tensor::normal(shape, static_cast<uint64_t>(seed), offset + static_cast<uint64_t>(r) * 1000,
                                      0.0, 1.0, kFloat64));
    }
    return pieces;
  }

  // The backward check of redistribute(x, from, to, gradient_arrives_as) described at the top, with
  // finite differences when `finite_differences`.
  void check_backward(const Layout& from, const Layout& to, const Layout& gradient_arrives_as,
                      bool finite_differences = false);

  TensorParallelGroup tp;
  int64_t seed = 1;
};

// The transitions every forward test covers (negative dims included), with their expected results.
std::vector<std::pair<Layout, Layout>> forward_cases() {
  return {
      {kPartial, kReplicate}, {kPartial, split(0)},  {kPartial, split(1)},  {kPartial, split(-1)},
      {split(0), kReplicate}, {split(1), kReplicate}, {split(-1), kReplicate}, {kReplicate, split(0)},
      {kReplicate, split(1)}, {kReplicate, split(2)}, {kReplicate, kReplicate}, {split(1), split(1)},
      {split(-2), split(1)},  {kPartial, kPartial},
  };
}

TEST_P(LayoutTransitions, ForwardMatchesThePartOfTheFullTensor) {
  const int rank = tp.rank();
  const int size = tp.size();
  const Shape shape = {4, 8, 4};  // [B, T, C]: every dim divisible by 2 and 4
  for (DType dtype : {kFloat32, kFloat64, kBFloat16}) {
    const std::vector<Tensor> pieces = integer_pieces(shape, dtype);
    const Tensor full = sum_of(pieces);
    for (const auto& [from, to] : forward_cases()) {
      for (bool strided : {false, true}) {
        const std::string what = describe(from, to) + " " + std::string(dtype_name(dtype)) + (strided ? " strided" : "");
        Tensor x = local_of(full, pieces, from, rank, size);
        // The same values through non-contiguous strides: the collectives need contiguous copies.
        if (strided) x = x.transpose(0, 2).contiguous().transpose(0, 2);
        const Tensor before = x.clone();
        const Tensor y = change_layout(x, from, to, tp);
        const Tensor expected = to.is_partial() ? before : local_of(full, pieces, to, rank, size);
        EXPECT_EQ(y.dtype(), dtype) << what;
        expect_equal(y, expected, what);
        expect_equal(x, before, what + ": the input was written");
        if (is_identity(from, to, x.dim())) {
          EXPECT_TRUE(y.is_same(x)) << what << ": an identity returns x itself";
        } else {
          EXPECT_TRUE(y.is_contiguous()) << what;
          EXPECT_FALSE(y.requires_grad()) << what;
        }
      }
    }
  }
}

void LayoutTransitions::check_backward(const Layout& from, const Layout& to, const Layout& gradient_arrives_as,
                                       bool finite_differences) {
  const int rank = tp.rank();
  const int size = tp.size();
  const std::string what = describe(from, to) + ", gradient arriving as " + gradient_arrives_as.to_string();
  const Shape shape = {4, 4, 4};  // [B, T, C]: every dim divisible by 2 and 4
  const std::vector<Tensor> x_pieces = random_pieces(shape, 0);
  const Tensor x_full = sum_of(x_pieces);  // [B, T, C]
  // The weight of the loss: W = the sum of every rank's piece, so a Partial gradient has pieces too.
  const std::vector<Tensor> w_pieces = random_pieces(shape, 1 << 20);
  const Tensor w_full = sum_of(w_pieces);  // [B, T, C]
  const Tensor w = local_of(w_full, w_pieces, gradient_arrives_as, rank, size);
  // A Replicate gradient means every rank's loss is the whole loss: L is one rank's copy.
  const double copies = to.is_replicate() && gradient_arrives_as.is_replicate() ? size : 1.0;

  Tensor x = local_of(x_full, x_pieces, from, rank, size).set_requires_grad(true);
  const Tensor y = redistribute(x, from, to, gradient_arrives_as, tp);
  sum(y * w).backward();
  const Tensor gradient = x.grad();
  ASSERT_TRUE(gradient.defined()) << what;
  // dL/dX = W for the identity on full tensors; the gradient of a Partial input is W on every rank.
  expect_equal(gradient, local_of(w_full, w_pieces, gradient_layout_of(from), rank, size), what, 1e-12);
  if (!finite_differences) return;

  // L(x) over every rank, with no autograd: each rank's sum(y * w), summed over tp.
  autograd::NoGradGuard no_grad;
  Tensor probe = x.detach().clone();
  Tensor flat = probe.reshape({-1});  // a view: writing it writes probe
  auto loss = [&] {
    Tensor local = sum(change_layout(probe, from, to, tp) * w).reshape({1}).contiguous();
    tp.group->all_reduce(local, Reduction::kSum, CommStream())->wait();
    return local.item() / copies;
  };
  const double step = 1e-3;  // L is linear: the central difference is exact up to rounding
  const std::vector<double> analytic = gradient.to_vector();
  // A replicated input is one variable per element, moved on every rank at once; a split or partial
  // input has one per element of each rank's tensor, moved on its owner alone.
  const int owners = from.is_replicate() ? 1 : size;
  for (int owner = 0; owner < owners; ++owner) {
    const bool mine = from.is_replicate() || owner == rank;
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double original = flat.at({i});
      if (mine) flat.set({i}, original + step);
      const double above = loss();
      if (mine) flat.set({i}, original - step);
      const double below = loss();
      if (mine) flat.set({i}, original);
      if (mine) {
        EXPECT_NEAR(analytic[static_cast<size_t>(i)], (above - below) / (2 * step), 1e-8)
            << what << ": element " << i << " of rank " << rank;
      }
    }
  }
}

// Megatron's "copy to tensor-parallel region": forward identity (no copy), backward all-reduce.
TEST_P(LayoutTransitions, ReplicateEnteringColumnParallelAllReducesItsGradient) {
  Tensor x = Tensor::normal({2, 4, 4}, 7, 0, 0.0, 1.0, kFloat64).set_requires_grad(true);
  const Tensor y = redistribute(x, kReplicate, kReplicate, kPartial, tp);
  EXPECT_FALSE(y.is_same(x));  // a node of its own, so that backward can all-reduce
  EXPECT_EQ(y.storage(), x.storage()) << "the forward copied";
  EXPECT_TRUE(y.requires_grad());
  check_backward(kReplicate, kReplicate, kPartial, /*finite_differences=*/true);
}

// Megatron's sequence-parallel gather into a column-parallel matmul: backward reduce-scatter.
TEST_P(LayoutTransitions, SequenceGatherIntoColumnParallelReduceScattersItsGradient) {
  check_backward(split(1), kReplicate, kPartial, /*finite_differences=*/true);
}

// Megatron's row-parallel output into a sequence-parallel region: reduce-scatter, backward all-gather.
TEST_P(LayoutTransitions, ReduceScatterToSequenceParallelAllGathersItsGradient) {
  check_backward(kPartial, split(1), split(1), /*finite_differences=*/true);
}

// Megatron's "reduce from tensor-parallel region": all-reduce, backward identity.
TEST_P(LayoutTransitions, ReduceFromTensorParallelPassesItsGradientThrough) {
  check_backward(kPartial, kReplicate, kReplicate, /*finite_differences=*/true);
}

// Megatron's "scatter to sequence-parallel region" and "gather from tensor-parallel region".
TEST_P(LayoutTransitions, SliceAllGathersItsGradientAndGatherSlicesIt) {
  check_backward(kReplicate, split(1), split(1), /*finite_differences=*/true);
  check_backward(split(-1), kReplicate, kReplicate, /*finite_differences=*/true);
}

TEST_P(LayoutTransitions, EveryTransitionsGradientIsTheOneProcessGradient) {
  for (const auto& [from, to] : forward_cases()) {
    if (to.is_partial()) continue;  // a Partial output's loss needs a Replicate gradient: below
    check_backward(from, to, gradient_layout_of(to));
    // A Replicate output whose consumer is column-parallel: its gradient arrives Partial.
    if (to.is_replicate()) check_backward(from, to, kPartial);
  }
  check_backward(kPartial, kPartial, kReplicate);
  check_backward(split(0), split(0), split(0), /*finite_differences=*/true);
}

TEST_P(LayoutTransitions, DefaultGradientLayoutIsTheOutputs) {
  // redistribute(x, from, to) = redistribute(x, from, to, gradient_layout_of(to)): P -> R's backward
  // is the identity, so x's gradient is the incoming one, unreduced.
  Tensor x = Tensor::normal({2, 4}, 11, static_cast<uint64_t>(tp.rank()) * 100, 0.0, 1.0, kFloat64)
                 .set_requires_grad(true);
  const Tensor w = Tensor::normal({2, 4}, 12, 0, 0.0, 1.0, kFloat64);
  sum(redistribute(x, kPartial, kReplicate, tp) * w).backward();
  expect_equal(x.grad(), w, "partial -> replicate");
}

TEST_P(LayoutTransitions, BfloatGradientsKeepTheirDtype) {
  const Shape shape = {2, 4, 4};
  const Tensor full = integer_tensor(shape, seed, kBFloat16);
  Tensor x = shard_of(full, split(1), tp.rank(), tp.size()).set_requires_grad(true);
  const Tensor y = redistribute(x, split(1), kReplicate, kPartial, tp);
  EXPECT_EQ(y.dtype(), kBFloat16);
  const Tensor w = integer_tensor(shape, seed + 1 + tp.rank(), kBFloat16);  // this rank's piece
  sum(y * w).backward();
  std::vector<Tensor> w_pieces;
  for (int r = 0; r < tp.size(); ++r) w_pieces.push_back(integer_tensor(shape, seed + 1 + r, kBFloat16));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kBFloat16);
  expect_equal(x.grad(), shard_of(sum_of(w_pieces), split(1), tp.rank(), tp.size()), "bf16 reduce-scatter");
}

TEST_P(LayoutTransitions, UnsupportedTransitionsNameBothLayouts) {
  const Tensor x = Tensor::zeros({4, 8, 4}, kFloat32);
  testing::expect_contains(testing::error_message([&] { change_layout(x, kReplicate, kPartial, tp); }),
                           {"replicate", "partial"});
  testing::expect_contains(testing::error_message([&] { change_layout(x, split(0), split(1), tp); }),
                           {"split(0)", "split(1)"});
  testing::expect_contains(testing::error_message([&] { change_layout(x, split(-1), split(0), tp); }),
                           {"split(-1)", "split(0)"});
  testing::expect_contains(testing::error_message([&] { redistribute(x, split(0), kPartial, tp); }),
                           {"split(0)", "partial"});
  // The gradient has the output's local shape: a split output's gradient cannot arrive replicated.
  testing::expect_contains(testing::error_message([&] { redistribute(x, kReplicate, split(1), kReplicate, tp); }),
                           {"split(1)", "replicate"});
  testing::expect_contains(testing::error_message([&] { change_layout(x, Layout::split(0, {2, 2}), kReplicate, tp); }),
                           {"blocks"});
  testing::expect_contains(testing::error_message([&] { change_layout(x, split(3), kReplicate, tp); }),
                           {"change_layout", "3"});
}

TEST_P(LayoutTransitions, IndivisibleSplitNamesTheShapeAndSize) {
  const Tensor x = Tensor::zeros({2, 3, 4}, kFloat32);
  const std::string size = std::to_string(tp.size());
  testing::expect_contains(testing::error_message([&] { change_layout(x, kReplicate, split(1), tp); }),
                           {"[2, 3, 4]", size});
  testing::expect_contains(testing::error_message([&] { change_layout(x, kPartial, split(-2), tp); }),
                           {"[2, 3, 4]", size});
  // Every rank refused before any collective: the group still works.
  Tensor probe = Tensor::ones({1}, kFloat32);
  tp.group->all_reduce(probe, Reduction::kSum, tp.stream)->wait();
  EXPECT_EQ(probe.item(), tp.size());
}

std::string parameter_name(const ::testing::TestParamInfo<LayoutTransitions::ParamType>& info) {
  const std::string stream = std::get<0>(info.param) ? "CommThread" : "CallerStream";
  const std::string group = std::get<1>(info.param) == GroupKind::kWorld ? "World" : "MeshTensorAxis";
  return group + stream;
}

INSTANTIATE_TEST_SUITE_P(GroupsAndStreams, LayoutTransitions,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(GroupKind::kWorld, GroupKind::kMeshTensorAxis)),
                         parameter_name);

}  // namespace
}  // namespace weft
