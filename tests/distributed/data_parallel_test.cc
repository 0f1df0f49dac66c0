// The data-parallel strategy against one process, inside one test program under mpirun (-np 2 and
// -np 4): every rank also trains a reference copy of the model on the whole global batch by itself,
// and after several steps the data-parallel model must hold the same weights, for ZeRO 0, 1 and 2,
// with AdamW and with SGD, with gradient clipping active, in both comm modes; and the two comm
// modes must agree bit for bit.
#include <cmath>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "optim/gradient_clipping.h"
#include "parallel/strategy.h"
#include "parallel/mesh.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"
#include "tests/support/random_token_ids.h"

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
  return testing::random_token_ids({kGlobalBatch, kSequence + 1}, 64, 77, static_cast<uint64_t>(step) * 1000);
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

StrategyOptions strategy_options(const Case& c, const std::string& mode) {
  StrategyOptions options;
  options.comm_mode = mode;
  options.zero_stage = c.zero;
  options.bucket_bytes = 4096;  // several buckets, some splitting a parameter
  options.weight_decay = 0.1;
  options.grad_clip = 0.5;      // active from the first step
  options.make_optimizer = [c](std::vector<ParameterGroup> groups) {
    return c.adamw ? make_adamw(std::move(groups), {0.9, 0.95, 1e-8}) : make_sgd(std::move(groups), {0.9, false});
  };
  return options;
}

// This rank's rows of each step's global batch, as the trainer hands them to the strategy.
MicroBatchSource rank_rows(const Tensor& batch, int64_t first_row, int64_t rows) {
  return [batch, first_row, rows] {
    Tensor part = batch.narrow(0, first_row, rows);
    return MicroBatch{part.narrow(1, 0, kSequence).contiguous(), part.narrow(1, 1, kSequence).contiguous()};
  };
}

class DataParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelTest, BothModesMatchOneProcessOnTheGlobalBatchAndEachOther) {
  const Case c = GetParam();
  const int world = mpi_world_size(), rank = mpi_world_rank();
  ASSERT_EQ(kGlobalBatch % world, 0);
  const Mesh mesh(world, 1, 1, world);
  const double lr = c.adamw ? 1e-2 : 0.5, max_norm = 0.5;

  std::shared_ptr<LanguageModel> reference = build_model(small_model());
  auto reference_optimizer =
      strategy_options(c, "manual").make_optimizer(default_parameter_groups(reference->named_parameters(), 0.1));
  std::shared_ptr<LanguageModel> manual_model = build_model(small_model());
  std::shared_ptr<LanguageModel> auto_model = build_model(small_model());
  std::unique_ptr<Strategy> manual = make_strategy(mesh, rank, *manual_model, strategy_options(c, "manual"));
  std::unique_ptr<Strategy> automatic = make_strategy(mesh, rank, *auto_model, strategy_options(c, "auto"));

  const int64_t rows = kGlobalBatch / world;
  for (int64_t step = 0; step < kSteps; ++step) {
    const Tensor batch = global_batch(step);
    const Tensor reference_loss = batch_loss(*reference, batch, 0, kGlobalBatch);
    reference_loss.backward();
    const double reference_norm = clip_grad_norm(reference->parameters(), max_norm);
    reference_optimizer->step(lr);
    reference_optimizer->zero_grad();

    const StepReport manual_report = manual->step(step + 1, lr, rank_rows(batch, rank * rows, rows));
    const StepReport auto_report = automatic->step(step + 1, lr, rank_rows(batch, rank * rows, rows));
    EXPECT_NEAR(manual_report.grad_norm, reference_norm, 1e-4 * reference_norm) << "step " << step;
    EXPECT_NEAR(manual_report.loss, reference_loss.item(), 1e-5 * reference_loss.item()) << "step " << step;
    EXPECT_EQ(manual_report.loss, auto_report.loss) << "step " << step;
    EXPECT_EQ(manual_report.grad_norm, auto_report.grad_norm) << "step " << step;
    EXPECT_GT(manual_report.comm_ms, 0.0);
    EXPECT_GT(auto_report.comm_ms, 0.0);
  }
  manual->complete_parameter_updates();
  automatic->complete_parameter_updates();
  const auto expected = reference->state_dict();
  const auto automatic_state = auto_model->state_dict();
  for (const auto& [name, tensor] : manual_model->state_dict()) {
    // AdamW's first updates are sign-like, so its tolerance is looser than SGD's (see
    // docs/architecture.md); both are far below the size of one update.
    EXPECT_LE(testing::relative_error(tensor, expected.at(name)), c.adamw ? 2e-3 : 1e-5) << name;
    EXPECT_EQ(testing::relative_error(tensor, automatic_state.at(name)), 0.0) << name << " differs between modes";
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
