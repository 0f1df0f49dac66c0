// The training loop end to end on the CPU: the loss falls, a resumed run continues bit-exactly,
// checkpoints hold what resuming needs, and run-time errors name what to fix.
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "launcher/checkpoint.h"
#include "launcher/config_loader.h"
#include "launcher/trainer.h"
#include "runtime/error.h"
#include "runtime/ops/bias_gradient_handoff.h"

namespace weft {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("weft-trainer-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    // A small repetitive text: learnable within a few dozen steps.
    std::ofstream text(root_ / "text.txt");
    for (int i = 0; i < 400; ++i) text << "the quick brown fox jumps over the lazy dog " << i % 7 << ".\n";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  RunConfig tiny_config() const {
    RunConfig config;
    config.model.layers = 1;
    config.model.dim = 16;
    config.model.heads = 2;
    config.model.seq_len = 16;
    config.model.dropout = 0.1;  // exercises the dropout streams a resume must restore
    config.train.batch_size = 4;
    config.train.micro_batches = 2;
    config.train.steps = 6;
    config.train.warmup_steps = 2;
    config.train.lr = 1e-2;
    config.data.train = (root_ / "text.txt").string();
    config.data.val_every = 0;
    config.log.every = 1000;
    config.log.progress = "plain";
    return config;
  }

  std::filesystem::path root_;
};

TEST_F(TrainerTest, LossFallsOnRepetitiveText) {
  RunConfig config = tiny_config();
  config.model.dropout = 0.0;
  config.train.steps = 40;
  config.train.micro_batches = 1;
  config.train.warmup_steps = 5;
  TrainResult result = Trainer(config).run();
  ASSERT_EQ(result.losses.size(), 40u);
  EXPECT_NEAR(result.losses.front(), std::log(256.0), 0.3) << "a fresh model predicts bytes near-uniformly";
  EXPECT_LT(result.losses.back(), result.losses.front() - 1.5) << "the loss did not fall by 1.5 nats in 40 steps";
}

// In a training step (the step graph, its segments one block each), every block's output
// projections take their bias gradients from the norms' backwards (runtime/ops/
// bias_gradient_handoff.h): the attention's from add_layer_norm's, the MLP's, across the segment
// cut, from the next block's first norm (the last block's from the final norm). Twice per block,
// micro-batch and step.
TEST_F(TrainerTest, OutputProjectionsTakeTheirBiasGradientsFromTheNorms) {
  RunConfig config = tiny_config();
  config.model.layers = 2;
  config.model.dropout = 0.0;  // a dropout between the projection and the norm would keep them apart
  config.train.steps = 3;
  const int64_t before = bias_gradient_handoff_count.load();
  Trainer(config).run();
  EXPECT_EQ(bias_gradient_handoff_count.load() - before, 2 * 2 * 2 * 3) << "2 x layers x micro-batches x steps";
}

TEST_F(TrainerTest, WarmupLongerThanTheRunIsCutWithAWarning) {
  // A smoke test of a long run's config (--set train.steps=3) keeps its warm-up key: the run trains,
  // warms up over its own 3 steps, and says so.
  RunConfig config = tiny_config();
  config.train.steps = 3;
  config.train.warmup_steps = 10;
  config.train.schedule = "constant";
  EXPECT_NO_THROW(validate_config(config));
  testing::internal::CaptureStdout();
  const TrainResult result = Trainer(config).run();
  const std::string log = testing::internal::GetCapturedStdout();
  EXPECT_NE(log.find("warning: train.warmup_steps = 10 is more than train.steps = 3; the warm-up is cut to 3 steps"),
            std::string::npos)
      << log;
  ASSERT_EQ(result.steps.size(), 3u);
  // Warm-up over 3 steps: lr/3, 2lr/3, lr (not lr/10, 2lr/10, 3lr/10).
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(result.steps[i].lr, config.train.lr * static_cast<double>(i + 1) / 3.0) << "step " << i + 1;
  }
}

TEST_F(TrainerTest, ResumedRunContinuesBitExactly) {
  RunConfig straight = tiny_config();
  straight.checkpoint.dir = (root_ / "checkpoints").string();
  straight.checkpoint.every = 3;
  const TrainResult full = Trainer(straight).run();
  ASSERT_EQ(full.losses.size(), 6u);

  RunConfig resumed = straight;
  resumed.checkpoint.dir = (root_ / "resumed").string();
  resumed.checkpoint.resume = (root_ / "checkpoints" / checkpoint_folder_name(3)).string();
  const TrainResult rest = Trainer(resumed).run();
  ASSERT_EQ(rest.first_step, 4);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rest.losses[i], full.losses[3 + i]) << "step " << 4 + i << " differs after resuming";
  }
  // The final weights agree bit for bit too.
  const LoadedCheckpoint a = load_checkpoint((root_ / "checkpoints").string());
  const LoadedCheckpoint b = load_checkpoint((root_ / "resumed").string());
  ASSERT_EQ(a.step, 6);
  ASSERT_EQ(b.step, 6);
  for (const auto& [name, tensor] : a.tensors) {
    ASSERT_EQ(b.tensors.count(name), 1u) << name;
    EXPECT_EQ(tensor.to_vector(), b.tensors.at(name).to_vector()) << name;
  }
}

TEST_F(TrainerTest, ResumeLatestWithoutCheckpointsStartsFresh) {
  RunConfig config = tiny_config();
  config.train.steps = 2;
  config.train.warmup_steps = 1;
  config.checkpoint.dir = (root_ / "empty").string();
  config.checkpoint.resume = "latest";
  EXPECT_EQ(Trainer(config).run().first_step, 1);
}

TEST_F(TrainerTest, CheckpointFromAnotherModelIsRefusedByName) {
  RunConfig config = tiny_config();
  config.train.steps = 1;
  config.train.warmup_steps = 0;
  config.checkpoint.dir = (root_ / "small").string();
  Trainer(config).run();
  RunConfig wider = tiny_config();
  wider.model.dim = 32;
  wider.checkpoint.resume = (root_ / "small").string();
  try {
    Trainer trainer(wider);
    FAIL() << "a checkpoint of a 16-wide model loaded into a 32-wide one";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("shape"), std::string::npos) << error.what();
  }
}

TEST_F(TrainerTest, AFreshRunDoesNotOverwriteAnotherRunsCheckpoints) {
  RunConfig config = tiny_config();
  config.train.steps = 1;
  config.train.warmup_steps = 0;
  config.checkpoint.dir = (root_ / "run").string();
  Trainer(config).run();
  try {
    Trainer again(config);  // no checkpoint.resume: would start over and replace step 1
    FAIL() << "a fresh run was allowed to write over another run's checkpoints";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("already holds checkpoints"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("checkpoint.resume"), std::string::npos) << error.what();
  }
}

TEST_F(TrainerTest, UnwritableCheckpointFolderIsRefusedBeforeTraining) {
  std::ofstream((root_ / "a-file").string()) << "not a folder";
  RunConfig config = tiny_config();
  config.checkpoint.dir = (root_ / "a-file").string();
  try {
    Trainer trainer(config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("checkpoint.dir"), std::string::npos) << error.what();
  }
}

TEST_F(TrainerTest, AResumedRunRewritesTheMetricsOfTheStepsItRepeats) {
  RunConfig config = tiny_config();
  config.checkpoint.dir = (root_ / "first").string();
  config.checkpoint.every = 3;
  config.log.metrics_file = (root_ / "metrics.jsonl").string();
  Trainer(config).run();
  config.checkpoint.dir = (root_ / "second").string();
  config.checkpoint.resume = (root_ / "first" / checkpoint_folder_name(3)).string();
  Trainer(config).run();
  std::vector<int64_t> steps;
  std::ifstream metrics(config.log.metrics_file);
  for (std::string line; std::getline(metrics, line);) {
    const size_t at = line.find("\"step\":");
    ASSERT_NE(at, std::string::npos) << line;
    steps.push_back(std::stoll(line.substr(at + 7)));
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST_F(TrainerTest, TextVocabularyLargerThanModelIsAnError) {
  RunConfig config = tiny_config();
  config.model.vocab = 100;
  try {
    Trainer trainer(config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("model.vocab"), std::string::npos) << error.what();
  }
}

TEST_F(TrainerTest, MissingDataFileIsAnErrorNamingTheKey) {
  RunConfig config = tiny_config();
  config.data.train = (root_ / "no-such-file.txt").string();
  try {
    Trainer trainer(config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("data.train"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("no-such-file.txt"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace weft
