// Sharding (parallel/tensor/sharding.h): shards against hand-written slices, the round trip back to
// the full tensor for plain and blocked splits, and the errors for layouts that cannot shard.
#include <gtest/gtest.h>

#include "parallel/tensor/sharding.h"
#include "runtime/error.h"

namespace weft {
namespace {

Tensor counting(Shape shape) {
  return Tensor::arange(shape_numel(shape), kFloat64).reshape(shape);
}

TEST(Sharding, SplitRowsGiveEachRankItsRows) {
  const Tensor full = counting({4, 3});  // rows 0..3
  const Tensor shard = shard_of(full, Layout::split(0), 1, 2);
  EXPECT_EQ(shard.shape(), Shape({2, 3}));
  EXPECT_EQ(shard.at({0, 0}), 6.0);  // row 2
  EXPECT_EQ(shard.at({1, 2}), 11.0);
}

TEST(Sharding, SplitColumnsGiveEachRankItsColumns) {
  const Tensor full = counting({2, 4});
  const Tensor shard = shard_of(full, Layout::split(-1), 1, 2);
  EXPECT_EQ(shard.shape(), Shape({2, 2}));
  EXPECT_EQ(shard.at({0, 0}), 2.0);
  EXPECT_EQ(shard.at({1, 1}), 7.0);
}

TEST(Sharding, BlockedSplitTakesEachRanksPartOfEveryBlock) {
  // Rows: q 0..3, k 4..5, v 6..7 of a fused [8, 1] weight; rank 1 of 2 holds q 2-3, k 5, v 7.
  const Tensor full = counting({8, 1});
  const Tensor shard = shard_of(full, Layout::split(0, {4, 2, 2}), 1, 2);
  ASSERT_EQ(shard.shape(), Shape({4, 1}));
  EXPECT_EQ(shard.at({0, 0}), 2.0);
  EXPECT_EQ(shard.at({1, 0}), 3.0);
  EXPECT_EQ(shard.at({2, 0}), 5.0);
  EXPECT_EQ(shard.at({3, 0}), 7.0);
}

TEST(Sharding, ShardsAssembleToTheFullTensor) {
  const Tensor full = counting({12, 6});
  for (const Layout& layout : {Layout::split(0), Layout::split(1), Layout::split(0, {6, 3, 3}), Layout::replicate()}) {
    for (int size : {1, 3}) {
      std::vector<Tensor> shards;
      for (int rank = 0; rank < size; ++rank) shards.push_back(shard_of(full, layout, rank, size));
      EXPECT_EQ(shards[0].shape(), shard_shape(full.shape(), layout, size)) << layout.to_string();
      const Tensor back = assemble_shards(shards, layout);
      ASSERT_EQ(back.shape(), full.shape()) << layout.to_string();
      for (int64_t i = 0; i < full.numel(); ++i) {
        ASSERT_EQ(back.reshape({-1}).at({i}), full.reshape({-1}).at({i})) << layout.to_string() << " over " << size;
      }
    }
  }
}

TEST(Sharding, ShardIsItsOwnStorage) {
  const Tensor full = counting({4, 2});
  Tensor shard = shard_of(full, Layout::split(0), 0, 2);
  shard.fill_(-1.0);
  EXPECT_EQ(full.at({0, 0}), 0.0);
}

TEST(Sharding, IndivisibleBlocksAndPartialAreRefused) {
  const Tensor full = counting({6, 2});
  EXPECT_THROW(shard_of(full, Layout::split(0), 0, 4), Error);
  EXPECT_THROW(shard_of(full, Layout::split(0, {4, 1, 1}), 0, 2), Error);
  EXPECT_THROW(shard_of(full, Layout::split(0, {2, 2}), 0, 2), Error);  // blocks add up to 4, not 6
  EXPECT_THROW(shard_of(full, Layout::partial(), 0, 2), Error);
  try {
    check_shardable(full.shape(), Layout::split(0), 4, "blocks.0.attention.qkv.weight");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("blocks.0.attention.qkv.weight"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace weft
