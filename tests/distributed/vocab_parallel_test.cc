// Vocabulary-parallel embedding and cross-entropy (parallel/tensor/vocab_parallel.h) under mpirun
// -np 2 and 4, with the world as the tp group (on the caller stream and on a comm thread) and with
// the group of one: forward and backward at f64 against the one-rank embedding and cross_entropy,
// ignore_index included (the default and one that is a real id), and the cross-entropy's gradient
// against finite differences.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "parallel/manual/mappings.h"
#include "parallel/tensor/sharding.h"
#include "parallel/tensor/vocab_parallel.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduction.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using testing::max_abs_difference;
using testing::random_leaf;

constexpr int64_t kVocab = 12;  // divisible by 1, 2 and 4 ranks

enum class GroupKind { kWorldCaller, kWorldThread, kLocal };

class VocabParallel : public ::testing::TestWithParam<GroupKind> {
 protected:
  void SetUp() override {
    if (GetParam() == GroupKind::kLocal) {
      tp = {make_local_process_group(Device::cpu()), CommStream()};
    } else {
      tp = {make_world_process_group(Device::cpu()),
            GetParam() == GroupKind::kWorldThread ? CommStream::cpu("tp_comm") : CommStream()};
    }
  }
  TensorParallelGroup tp;
};

Tensor ids_of(std::vector<int64_t> values, Shape shape) { return Tensor::from_vector(values, shape, kInt64); }

TEST_P(VocabParallel, EmbeddingPartialsSumToTheLookupAndItsGradient) {
  const Tensor full = random_leaf({kVocab, 5}, 11);                              // [V, C]
  const Tensor ids = ids_of({0, 11, 3, 3, 6, 5, 9, 2, 11, 1, 7, 4}, {3, 4});   // repeats, every shard
  const Tensor weights = random_leaf({3, 4, 5}, 12, false);
  const Tensor expected = embedding(ids, full);
  sum(mul(expected, weights)).backward();

  const Layout rows = Layout::split(0);
  Tensor shard = shard_of(full.detach(), rows, tp.rank(), tp.size()).set_requires_grad(true);
  const Tensor partial = vocab_parallel_embedding_partial(ids, shard, tp.rank() * (kVocab / tp.size()));
  ASSERT_EQ(partial.shape(), Shape({3, 4, 5}));
  sum(mul(partial, weights)).backward();
  Tensor summed = partial.detach().clone();
  tp.group->all_reduce(summed, Reduction::kSum, tp.stream)->wait();
  EXPECT_EQ(max_abs_difference(summed, expected), 0.0);
  EXPECT_LT(max_abs_difference(shard.grad(), shard_of(full.grad(), rows, tp.rank(), tp.size())), 1e-15);
}

struct LossCase {
  std::vector<int64_t> targets;  // [7]
  int64_t ignore_index;
  bool give_count;
  double output_gradient;
};

TEST_P(VocabParallel, CrossEntropyMatchesTheFullLogits) {
  const std::vector<LossCase> cases = {
      {{0, 11, 5, -100, 3, 8, 6}, -100, false, 1.0},
      {{0, 11, 5, -100, 3, 8, 6}, -100, true, 2.5},
      {{5, 1, 5, 10, 7, 5, 2}, 5, true, 1.0},            // ignore_index is a real id
      {{-1, -1, -1, -1, -1, -1, -1}, -1, false, 1.0},  // every row ignored: 0, zero gradients
  };
  for (const LossCase& test : cases) {
    Tensor full = scale(random_leaf({7, kVocab}, 21), 3.0).detach().set_requires_grad(true);  // [N, V]
    const Tensor targets = ids_of(test.targets, {7});
    int64_t counted = 0;
    for (int64_t target : test.targets) counted += target != test.ignore_index;
    const Tensor expected = cross_entropy(full, targets, test.ignore_index);
    expected.backward(Tensor::scalar(test.output_gradient, kFloat64));

    const Layout columns = Layout::split(-1);
    Tensor shard = shard_of(full.detach(), columns, tp.rank(), tp.size()).set_requires_grad(true);
    const Tensor loss =
        vocab_parallel_cross_entropy(shard, targets, test.ignore_index, test.give_count ? counted : -1, tp);
    loss.backward(Tensor::scalar(test.output_gradient, kFloat64));
    EXPECT_NEAR(loss.item(), expected.item(), 1e-13) << "ignore_index " << test.ignore_index;
    EXPECT_LT(max_abs_difference(shard.grad(), shard_of(full.grad(), columns, tp.rank(), tp.size())), 1e-15)
        << "ignore_index " << test.ignore_index;
  }
}

TEST_P(VocabParallel, CrossEntropyOfSixteenBitLogitsIsComputedInFloat) {
  const Tensor full = scale(random_leaf({7, kVocab}, 23), 3.0).detach().to(kBFloat16);  // [N, V]
  const Tensor targets = ids_of({1, 2, 3, 4, 5, 6, 7}, {7});
  const Tensor shard = shard_of(full, Layout::split(-1), tp.rank(), tp.size());
  const Tensor loss = vocab_parallel_cross_entropy(shard, targets, -100, 7, tp);
  EXPECT_EQ(loss.dtype(), kFloat32);
  EXPECT_NEAR(loss.item(), cross_entropy(full, targets).item(), 1e-5);
}

TEST_P(VocabParallel, CrossEntropyGradientMatchesFiniteDifferences) {
  const Tensor targets = ids_of({0, 11, 5, -100, 3, 8, 6}, {7});
  const int64_t width = kVocab / tp.size();
  // Every rank perturbs the same element of the replicated full logits; copy_to_tensor_parallel_region
  // sums the shards' gradients back into the full one.
  testing::expect_gradients_match(
      [&](const std::vector<Tensor>& inputs) {
        const Tensor replicated = copy_to_tensor_parallel_region(inputs[0], tp);
        return vocab_parallel_cross_entropy(replicated.narrow(1, tp.rank() * width, width), targets, -100, -1, tp);
      },
      {random_leaf({7, kVocab}, 31)});
}

INSTANTIATE_TEST_SUITE_P(Groups, VocabParallel,
                         ::testing::Values(GroupKind::kWorldCaller, GroupKind::kWorldThread, GroupKind::kLocal),
                         [](const ::testing::TestParamInfo<GroupKind>& info) {
                           switch (info.param) {
                             case GroupKind::kWorldCaller: return "WorldCallerStream";
                             case GroupKind::kWorldThread: return "WorldCommThread";
                             case GroupKind::kLocal: return "GroupOfOne";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace weft
