// DataParallel against one process, inside one test program under mpirun (-np 2 and -np 4): every
// rank also trains a reference copy of the model on the whole global batch by itself, and after
// several steps the data-parallel model must hold the same weights, for ZeRO 0, 1 and 2, with
// AdamW and with SGD, and with gradient clipping active.
#include <cmath>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "optim/gradient_clipping.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

constexpr int64_t kGlobalBatch = 8, kSteps = 4, kSequence = 16;

ModelConfig small_model() {
  ModelConfig config;
  config.layers = 2;
  config.dim = 16;
  config.heads = 2;
  config.seq_len = kSequence;
  config.vocab = 64;
  config.seed = 5;
  return config;
}

// The global batch of a step: the same on every rank (Philox from the step), ids [B, T + 1].
Tensor global_batch(int64_t step) {
  std::vector<double> draws = Tensor::uniform({kGlobalBatch, kSequence + 1}, 77, static_cast<uint64_t>(step) * 1000,
                                              0.0, 64.0, kFloat64)
                                  .to_vector();
  std::vector<int64_t> ids(draws.begin(), draws.end());
  return Tensor::from_vector(absl::Span<const int64_t>(ids), {kGlobalBatch, kSequence + 1});
}

// Mean next-token loss of `rows` of the batch.
Tensor batch_loss(LanguageModel& model, const Tensor& batch, int64_t first_row, int64_t rows) {
  Tensor part = batch.narrow(0, first_row, rows);
  return loss(model, part.narrow(1, 0, kSequence).contiguous(), part.narrow(1, 1, kSequence).contiguous());
}

struct Case {
  int64_t zero;
  bool adamw;
};

class DataParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelTest, MatchesOneProcessOnTheGlobalBatch) {
  const Case c = GetParam();
  const int world = mpi_world_size(), rank = mpi_world_rank();
  ASSERT_EQ(kGlobalBatch % world, 0);
  const Mesh mesh(world, 1, 1, world);
  auto make = [&](std::vector<ParameterGroup> groups) {
    return c.adamw ? make_adamw(std::move(groups), {0.9, 0.95, 1e-8}) : make_sgd(std::move(groups), {0.9, false});
  };
  const double lr = c.adamw ? 1e-2 : 0.5, max_norm = 0.5;  // the clip is active from the first step

  std::shared_ptr<LanguageModel> reference = build_model(small_model());
  auto reference_optimizer = make(default_parameter_groups(reference->named_parameters(), 0.1));
  std::shared_ptr<LanguageModel> model = build_model(small_model());
  DataParallel data_parallel(*model, make_process_group(mesh, Axis::kData, Device::cpu()), CommStream(),
                             {.zero_stage = c.zero, .bucket_bytes = 4096, .weight_decay = 0.1});
  auto optimizer = data_parallel.make_optimizer(make);

  const int64_t rows = kGlobalBatch / world;
  for (int64_t step = 0; step < kSteps; ++step) {
    const Tensor batch = global_batch(step);
    batch_loss(*reference, batch, 0, kGlobalBatch).backward();
    const double reference_norm = clip_grad_norm(reference->parameters(), max_norm);
    reference_optimizer->step(lr);
    reference_optimizer->zero_grad();

    batch_loss(*model, batch, rank * rows, rows).backward();
    data_parallel.reduce_gradients();
    const double norm = data_parallel.clip_gradients(max_norm);
    optimizer->step(lr);
    data_parallel.finish_step();
    data_parallel.zero_grad();
    EXPECT_NEAR(norm, reference_norm, 1e-4 * reference_norm) << "step " << step;
  }
  const auto expected = reference->state_dict();
  for (const auto& [name, tensor] : model->state_dict()) {
    // AdamW's first updates are sign-like, so its tolerance is looser than SGD's (see
    // docs/architecture.md); both are far below the size of one update.
    EXPECT_LE(testing::relative_error(tensor, expected.at(name)), c.adamw ? 2e-3 : 1e-5) << name;
  }
  if (c.zero > 0) {
    EXPECT_LE(data_parallel.shard_elements() * world, data_parallel.flat_elements());
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroStagesAndOptimizers, DataParallelTest,
                         ::testing::Values(Case{0, false}, Case{1, false}, Case{2, false}, Case{0, true},
                                           Case{1, true}, Case{2, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.adamw ? "adamw" : "sgd") + "_zero" +
                                  std::to_string(info.param.zero);
                         });

}  // namespace
}  // namespace weft
