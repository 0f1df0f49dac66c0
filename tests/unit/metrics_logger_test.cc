// MetricsLogger's step line and metrics-file object for a skipped step: the non-finite value is
// shown as it is (never as 0, which would read as a step without gradient) and the note names the
// value that was not finite.
#include "launcher/metrics_logger.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "nlohmann/json.hpp"

namespace weft {
namespace {

StepMetrics step_metrics(int64_t step, double loss, double grad_norm, bool skipped) {
  StepMetrics metrics;
  metrics.step = step;
  metrics.loss = loss;
  metrics.lr = 1e-3;
  metrics.grad_norm = grad_norm;
  metrics.tokens_per_s = 1000;
  metrics.step_ms = 10;
  metrics.skipped = skipped;
  return metrics;
}

// The plain line log_step prints for `metrics`, and the metrics file's object for it. The file is
// named after the running test: ctest runs each test as its own process, at the same time.
std::pair<std::string, nlohmann::json> logged(const StepMetrics& metrics) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string file = (std::filesystem::path(::testing::TempDir()) / ("metrics_logger_" + test + ".jsonl")).string();
  ::testing::internal::CaptureStdout();
  {
    MetricsLogger logger(/*total_steps=*/metrics.step, /*print_every=*/1, file, "plain");
    logger.log_step(metrics);
  }
  const std::string printed = ::testing::internal::GetCapturedStdout();
  std::ifstream lines(file);
  std::string line;
  std::getline(lines, line);
  return {printed, nlohmann::json::parse(line)};
}

TEST(MetricsLogger, ASkippedStepsNonFiniteLossAndNormAreShownAndNamed) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto [printed, json] = logged(step_metrics(2, nan, nan, true));
  EXPECT_NE(printed.find("grad nan"), std::string::npos) << printed;
  EXPECT_NE(printed.find("(update skipped: non-finite loss)"), std::string::npos) << printed;
  EXPECT_TRUE(json["loss"].is_null()) << json.dump();
  EXPECT_TRUE(json["grad_norm"].is_null()) << json.dump();
  EXPECT_TRUE(json["skipped"].get<bool>()) << json.dump();
}

TEST(MetricsLogger, ASkippedStepWithAFiniteLossNamesTheGradientNorm) {
  const auto [printed, json] = logged(step_metrics(3, 2.5, std::numeric_limits<double>::infinity(), true));
  EXPECT_NE(printed.find("loss 2.5000"), std::string::npos) << printed;
  EXPECT_NE(printed.find("grad inf"), std::string::npos) << printed;
  EXPECT_NE(printed.find("(update skipped: non-finite gradient norm)"), std::string::npos) << printed;
  EXPECT_EQ(json["loss"].get<double>(), 2.5) << json.dump();
  EXPECT_TRUE(json["grad_norm"].is_null()) << json.dump();
}

TEST(MetricsLogger, AnAppliedStepHasNoSkipNote) {
  const auto [printed, json] = logged(step_metrics(1, 2.5, 0.75, false));
  EXPECT_NE(printed.find("grad 0.750"), std::string::npos) << printed;
  EXPECT_EQ(printed.find("skipped"), std::string::npos) << printed;
  EXPECT_EQ(json["grad_norm"].get<double>(), 0.75) << json.dump();
  EXPECT_FALSE(json["skipped"].get<bool>()) << json.dump();
}

}  // namespace
}  // namespace weft
