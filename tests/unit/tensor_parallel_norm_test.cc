// squares_over_tensor_parallel_group: every rank of a tp group ends with the same bits (the group's
// sum for split parameters, its own value for replicated ones), on values where the arithmetic
// local + (summed - local) * split, which it replaced, rounds differently on two of four ranks.
#include "parallel/tensor/tensor_parallel_norm.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/weft.h"

namespace weft {
namespace {

Tensor f32_vector(const std::vector<float>& values) {
  return Tensor::from_vector(absl::Span<const float>(values), {static_cast<int64_t>(values.size())});
}

TEST(TensorParallelNorm, EveryRankOfFourGetsTheGroupSumBitForBit) {
  // One split parameter's squares on four tp ranks, and their sum in rank order (what the
  // all-reduce hands every rank).
  const std::vector<float> ranks = {25.133f, 93.999f, 61.639f, 70.907f};
  float summed = 0.0f;
  for (const float value : ranks) summed += value;
  int rounded_apart = 0;  // ranks on which the old arithmetic misses the sum
  for (const float local : ranks) {
    if (local + (summed - local) != summed) ++rounded_apart;
    // Entry 0 is the split parameter; entry 1 a replicated one, whose square is the same everywhere.
    const Tensor result = squares_over_tensor_parallel_group(f32_vector({local, 3.25f}), f32_vector({summed, 13.0f}),
                                                             f32_vector({1.0f, 0.0f}));
    const std::vector<double> values = result.to_vector();
    EXPECT_EQ(static_cast<float>(values[0]), summed) << "rank holding " << local;
    EXPECT_EQ(static_cast<float>(values[1]), 3.25f) << "a replicated parameter keeps its own square";
  }
  EXPECT_EQ(rounded_apart, 2) << "the values no longer show the rounding this guards against";
}

TEST(TensorParallelNorm, MismatchedShapesAreRefused) {
  EXPECT_THROW(squares_over_tensor_parallel_group(f32_vector({1, 2}), f32_vector({1}), f32_vector({1, 0})), Error);
}

}  // namespace
}  // namespace weft
