// Layout transitions (parallel/tensor/layout_transition.h) at tp = 1, no MPI: every transition is x
// itself (no copy, no autograd node), the layouts are still checked, and gradient_layout_of.
// The collectives' transitions are tested under mpirun in tests/distributed/layout_transition_test.cc.
#include <gtest/gtest.h>

#include "parallel/tensor/layout_transition.h"
#include "runtime/ops/reduction.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

TensorParallelGroup one_rank() { return {make_local_process_group(Device::cpu(), "tp"), CommStream()}; }

TEST(LayoutTransitionOneRank, EveryTransitionReturnsTheSameTensor) {
  const TensorParallelGroup tp = one_rank();
  Tensor x = Tensor::normal({2, 3, 5}, 1, 0, 0.0, 1.0, kFloat64).set_requires_grad(true);
  const std::vector<std::pair<Layout, Layout>> transitions = {
      {Layout::partial(), Layout::replicate()}, {Layout::partial(), Layout::split(1)},
      {Layout::split(1), Layout::replicate()},  {Layout::replicate(), Layout::split(-1)},
      {Layout::replicate(), Layout::replicate()}, {Layout::partial(), Layout::partial()}};
  for (const auto& [from, to] : transitions) {
    const std::string what = from.to_string() + " -> " + to.to_string();
    EXPECT_TRUE(change_layout(x, from, to, tp).is_same(x)) << what;
    EXPECT_TRUE(redistribute(x, from, to, tp).is_same(x)) << what;
  }
  // Even a non-identity backward (copy to tp region: backward all-reduce) is x at tp = 1.
  const Tensor y = redistribute(x, Layout::replicate(), Layout::replicate(), Layout::partial(), tp);
  EXPECT_TRUE(y.is_same(x));
  EXPECT_EQ(y.grad_fn(), nullptr);
  sum(y).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().at({1, 2, 4}), 1.0);
}

TEST(LayoutTransitionOneRank, LayoutsAreCheckedOnOneRankToo) {
  const TensorParallelGroup tp = one_rank();
  const Tensor x = Tensor::zeros({2, 3}, kFloat32);
  testing::expect_contains(
      testing::error_message([&] { change_layout(x, Layout::replicate(), Layout::partial(), tp); }),
      {"replicate", "partial"});
  testing::expect_contains(
      testing::error_message([&] { redistribute(x, Layout::split(0), Layout::split(1), tp); }),
      {"split(0)", "split(1)"});
  testing::expect_contains(
      testing::error_message([&] { change_layout(x, Layout::split(0, {1, 1}), Layout::replicate(), tp); }),
      {"blocks"});
}

TEST(LayoutTransitionOneRank, GradientLayouts) {
  EXPECT_EQ(gradient_layout_of(Layout::replicate()), Layout::replicate());
  EXPECT_EQ(gradient_layout_of(Layout::partial()), Layout::replicate());
  EXPECT_EQ(gradient_layout_of(Layout::split(-1)), Layout::split(-1));
}

}  // namespace
}  // namespace weft
