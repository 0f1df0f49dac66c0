// weft-compare's figures without running anything: the means leave the warm-up steps out, overlap
// is a ratio of mean times, the losses' verdict tells bits from values, and the table and JSON
// carry what a reader compares.
#include "launcher/comm_mode_comparison.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace weft {
namespace {

// A run of `step_ms.size()` steps: step i takes step_ms[i] with a tenth of it communicating and
// `exposed` of that exposed; losses fall from 5.
ModeRun run_of(const std::string& mode, const std::vector<double>& step_ms, double exposed_share) {
  ModeRun run;
  run.mode = mode;
  for (size_t i = 0; i < step_ms.size(); ++i) {
    StepMetrics metrics;
    metrics.step = static_cast<int64_t>(i) + 1;
    metrics.loss = 5.0 - 0.25 * static_cast<double>(i);
    metrics.step_ms = step_ms[i];
    metrics.tokens_per_s = 1000.0 / step_ms[i];
    metrics.compute_ms = 0.9 * step_ms[i];
    metrics.comm_ms = 0.1 * step_ms[i];
    metrics.exposed_comm_ms = exposed_share * metrics.comm_ms;
    run.steps.push_back(metrics);
  }
  run.peak_memory_mb_per_rank = {100.0, 120.0};
  run.exposed_comm_ms_per_rank = {0.0, 7.5};
  return run;
}

TEST(CommModeComparisonTest, WarmUpStepsAreLeftOutOfTheMeans) {
  EXPECT_EQ(warm_up_steps(3), 0);
  EXPECT_EQ(warm_up_steps(4), 2);
  const ModeFigures figures = mode_figures(run_of("manual", {500, 300, 10, 20, 30}, 0.5));
  EXPECT_EQ(figures.measured_steps, 3);
  EXPECT_DOUBLE_EQ(figures.step_ms, 20.0);
  EXPECT_DOUBLE_EQ(figures.comm_ms, 2.0);
  EXPECT_DOUBLE_EQ(figures.exposed_comm_ms, 1.0);
  ASSERT_TRUE(figures.overlap.has_value());
  EXPECT_DOUBLE_EQ(*figures.overlap, 0.5);
  EXPECT_DOUBLE_EQ(figures.peak_memory_mb, 120.0);  // the largest rank
  EXPECT_DOUBLE_EQ(figures.largest_exposed_comm_ms, 7.5);
  EXPECT_FALSE(figures.mfu.has_value());
  EXPECT_FALSE(figures.pipeline_bubble.has_value());
  // Three steps are too few to leave any out.
  EXPECT_DOUBLE_EQ(mode_figures(run_of("manual", {10, 20, 30}, 0.5)).step_ms, 20.0);
}

TEST(CommModeComparisonTest, NoCommunicationHasNoOverlap) {
  const ModeFigures figures = mode_figures(run_of("manual", {10, 10, 10, 10}, 0.0));
  EXPECT_DOUBLE_EQ(*figures.overlap, 1.0);
  ModeRun silent = run_of("manual", {10, 10, 10, 10}, 0.0);
  for (StepMetrics& step : silent.steps) step.comm_ms = 0;
  EXPECT_FALSE(mode_figures(silent).overlap.has_value());
}

TEST(CommModeComparisonTest, LossesAgreeBitwiseOrSayWhereTheyDifferMost) {
  const ModeRun manual = run_of("manual", {10, 10, 10, 10}, 1.0);
  ModeRun automatic = run_of("auto", {10, 10, 10, 10}, 0.1);
  LossAgreement agreement = compare_losses(manual, automatic);
  EXPECT_TRUE(agreement.bitwise);
  EXPECT_EQ(agreement.steps_compared, 4);
  EXPECT_EQ(loss_verdict(agreement, /*on_gpu=*/false), "bitwise equal over 4 steps");

  automatic.steps[1].loss = std::nextafter(automatic.steps[1].loss, 10.0);  // one bit
  automatic.steps[3].loss *= 1.0 + 1e-6;
  agreement = compare_losses(manual, automatic);
  EXPECT_FALSE(agreement.bitwise);
  EXPECT_EQ(agreement.step_of_max, 4);
  EXPECT_NEAR(agreement.max_relative_difference, 1e-6, 1e-12);
  EXPECT_EQ(loss_verdict(agreement, false), "differ: max relative difference 1e-06 at step 4");
  EXPECT_EQ(loss_verdict(agreement, true), "max relative difference 1e-06 at step 4");

  // A loss that is not finite in one mode is the worst difference, wherever it is.
  automatic.steps[0].loss = std::numeric_limits<double>::quiet_NaN();
  agreement = compare_losses(manual, automatic);
  EXPECT_EQ(agreement.step_of_max, 1);
  EXPECT_TRUE(std::isinf(agreement.max_relative_difference));
}

// The cells after `label` on the table's line that starts with it (empty when there is none).
std::vector<std::string> row(const std::string& table, const std::string& label) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(label + " ", 0) != 0) continue;
    std::istringstream cells(line.substr(label.size()));
    std::vector<std::string> out;
    for (std::string cell; cells >> cell;) out.push_back(cell);
    return out;
  }
  return {};
}

TEST(CommModeComparisonTest, TableAndJsonCarryBothModes) {
  ComparisonContext context;
  context.config.parallel.dp = 2;
  context.world_size = 2;
  context.tensor_parallel_block_lines_manual = 461;
  context.tensor_parallel_block_lines_auto = 18;
  ModeRun manual = run_of("manual", {50, 40, 40, 40}, 1.0);
  ModeRun automatic = run_of("auto", {50, 20, 20, 20}, 0.25);
  // What each mode took from the cost model, as weft-train's start-up lines say it.
  manual.description = {"data parallel over 2 ranks", "dp all-reduce: flat (comm.mode manual fixes the path in advance)",
                        "cost model: predicted step 38.00 ms"};
  automatic.description = {"data parallel over 2 ranks", "cost model: bucket 256 KB: predicted exposed 0.1 ms",
                           "dp all-reduce hierarchical: predicted 0.31 ms", "cost model: predicted step 19.00 ms"};
  const std::string table = comparison_table(context, manual, automatic);
  EXPECT_EQ(row(table, ""), std::vector<std::string>({"manual", "auto", "auto", "/", "manual"})) << table;
  EXPECT_EQ(row(table, "step ms"), std::vector<std::string>({"40.00", "20.00", "0.50"})) << table;
  EXPECT_EQ(row(table, "overlap (1 - exposed / comm)"), std::vector<std::string>({"0.0%", "75.0%"})) << table;
  EXPECT_EQ(row(table, "  largest rank"), std::vector<std::string>({"7.50", "7.50", "1.00"})) << table;
  EXPECT_EQ(row(table, "loss at step 4"), std::vector<std::string>({"4.250000", "4.250000", "bitwise"})) << table;
  EXPECT_NE(table.find("means over steps 3-4; the first 2 are warm-up"), std::string::npos) << table;
  EXPECT_NE(table.find("losses: bitwise equal over 4 steps"), std::string::npos) << table;
  EXPECT_NE(table.find("tensor-parallel block: manual 461 lines, auto 18 lines (tools/tp_block_lines.py)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("the manual mode's path and prediction:\n"
                       "  dp all-reduce: flat (comm.mode manual fixes the path in advance)\n"
                       "  predicted step 38.00 ms\n"
                       "the auto mode's choices:\n"
                       "  bucket 256 KB: predicted exposed 0.1 ms\n"
                       "  dp all-reduce hierarchical: predicted 0.31 ms\n"
                       "  predicted step 19.00 ms\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("data parallel over 2 ranks"), std::string::npos) << "only the cost model's lines";
  EXPECT_EQ(table.find("MFU"), std::string::npos) << "MFU is for GPUs only";
  EXPECT_EQ(table.find("pipeline bubble"), std::string::npos) << "no pipeline, no bubble rows";

  const nlohmann::json json = comparison_json(context, manual, automatic);
  EXPECT_EQ(json["config"]["dp"], 2);
  EXPECT_EQ(json["modes"]["auto"]["steps"].size(), 4u);
  EXPECT_EQ(json["modes"]["auto"]["steps"][1]["compute_ms"], 18.0);
  EXPECT_EQ(json["modes"]["manual"]["means"]["step_ms"], 40.0);
  EXPECT_EQ(json["modes"]["manual"]["peak_memory_mb_per_rank"], nlohmann::json({100.0, 120.0}));
  EXPECT_EQ(json["modes"]["auto"]["exposed_comm_ms_per_rank"], nlohmann::json({0.0, 7.5}));
  EXPECT_EQ(json["losses"]["bitwise"], true);
  EXPECT_EQ(json["tensor_parallel_block_lines"]["auto"], 18);
}

}  // namespace
}  // namespace weft
