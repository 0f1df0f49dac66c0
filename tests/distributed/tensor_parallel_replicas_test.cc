// Replicated parameters stay identical on every rank under tensor parallelism (tp = the world: 2
// and 4 ranks, where a sum over tp has more than two terms to round): after steps with gradient
// clipping active, every parameter that is not split over tp (norm weights, row-parallel biases)
// must hold the same bits on every rank, for ZeRO 0 and 1, in both comm modes, with and without
// sequence parallelism. Each rank updates its own copy of such a parameter, so any difference in
// what the ranks compute for the update (the clipping factor from the gradient norm, for one) makes
// the copies drift apart a little more each step, and a checkpoint (which keeps one copy) then
// resumes a different model on the other ranks.
#include <mpi.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "runtime/weft.h"
#include "tests/support/random_token_ids.h"

namespace weft {
namespace {

constexpr int64_t kGlobalBatch = 8, kSteps = 8, kSequence = 16;

ModelConfig small_model() {
  ModelConfig config;
  config.layers = 2;
  config.dim = 16;
  config.heads = 4;  // divisible by tp 4
  config.seq_len = kSequence;
  config.vocab = 64;
  config.seed = 11;
  return config;
}

// The global batch of a step, the same on every rank: ids [B, T + 1].
Tensor global_batch(int64_t step) {
  return testing::random_token_ids({kGlobalBatch, kSequence + 1}, 64, 91, static_cast<uint64_t>(step) * 1000);
}

struct Case {
  int64_t zero;
  std::string mode;
  bool sequence_parallel;  // norms then see a sequence chunk: their gradients are summed over tp
};

class TensorParallelReplicasTest : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelReplicasTest, ReplicatedParametersHoldTheSameBitsOnEveryRank) {
  const Case c = GetParam();
  const int world = mpi_world_size(), rank = mpi_world_rank();
  const Mesh mesh(1, 1, world, world);
  ParallelModel parallel = build_parallel_model(small_model(), mesh, Device::cpu(), c.mode, c.sequence_parallel, {});
  StrategyOptions options;
  options.comm_mode = c.mode;
  options.zero_stage = c.zero;
  options.bucket_bytes = 4096;
  options.weight_decay = 0.1;
  options.grad_clip = 0.05;  // below every step's norm: the clipping factor applies at every step
  options.tensor_parallel = parallel.tensor_parallel;
  options.sequence_parallel = c.sequence_parallel;
  options.make_optimizer = [](std::vector<ParameterGroup> groups) {
    return make_adamw(std::move(groups), {0.9, 0.95, 1e-8});
  };
  std::unique_ptr<Strategy> strategy = make_strategy(mesh, rank, *parallel.model, options);

  const int64_t rows = kGlobalBatch / mesh.dp(), first_row = mesh.coordinates(rank).dp * rows;
  for (int64_t step = 0; step < kSteps; ++step) {
    const Tensor part = global_batch(step).narrow(0, first_row, rows);
    const StepReport report = strategy->step(step + 1, 1e-2, [part] {
      return MicroBatch{part.narrow(1, 0, kSequence).contiguous(), part.narrow(1, 1, kSequence).contiguous()};
    });
    ASSERT_GT(report.grad_norm, options.grad_clip) << "step " << step << ": clipping must be active";
  }
  strategy->complete_parameter_updates();

  int replicated = 0;
  for (const NamedParameter& parameter : parallel.model->named_parameters()) {
    if (parameter.layout.is_split()) continue;
    ++replicated;
    // Element by element, the largest and smallest value over the ranks: equal everywhere exactly
    // when every rank holds the same bits (the values are finite f32, held exactly in f64).
    const std::vector<double> local = parameter.tensor.to_vector();
    std::vector<double> largest(local.size()), smallest(local.size());
    const int count = static_cast<int>(local.size());
    ASSERT_EQ(MPI_Allreduce(local.data(), largest.data(), count, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), MPI_SUCCESS);
    ASSERT_EQ(MPI_Allreduce(local.data(), smallest.data(), count, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD), MPI_SUCCESS);
    int differing = 0;
    for (int i = 0; i < count; ++i) differing += largest[i] != smallest[i] ? 1 : 0;
    EXPECT_EQ(differing, 0) << parameter.name << ": " << differing << " of " << count
                            << " elements differ between ranks after " << kSteps << " steps";
  }
  EXPECT_GT(replicated, 4) << "the model should have replicated parameters (norms, row-parallel biases)";
}

INSTANTIATE_TEST_SUITE_P(ZeroStagesAndModes, TensorParallelReplicasTest,
                         ::testing::Values(Case{0, "manual", false}, Case{0, "auto", false}, Case{1, "manual", false},
                                           Case{1, "auto", false}, Case{0, "manual", true}, Case{1, "auto", true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.mode + "_zero" + std::to_string(info.param.zero) +
                                  (info.param.sequence_parallel ? "_sp" : "");
                         });

}  // namespace
}  // namespace weft
