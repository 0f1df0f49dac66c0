#include "launcher/metrics_logger.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/error.h"

namespace weft {
namespace {

std::string format_duration(double seconds) {
  const int64_t total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600) return absl::StrFormat("%dh%02dm", total / 3600, (total / 60) % 60);
  return absl::StrFormat("%dm%02ds", total / 60, total % 60);
}

// JSON has no NaN or infinity: such values are written as null.
nlohmann::json number(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

// What a skipped step's line says, naming the value that was not finite.
std::string skip_note(const StepMetrics& m) {
  if (!m.skipped) return "";
  return std::isfinite(m.loss) ? "  (update skipped: non-finite gradient norm)" : "  (update skipped: non-finite loss)";
}

}  // namespace

nlohmann::json step_metrics_json(const StepMetrics& m) {
  nlohmann::json line = {{"step", m.step},
                         {"loss", number(m.loss)},
                         {"lr", m.lr},
                         {"grad_norm", number(m.grad_norm)},
                         {"tokens_per_s", m.tokens_per_s},
                         {"step_ms", m.step_ms},
                         {"elapsed_s", m.elapsed_s},
                         {"compute_ms", m.compute_ms},
                         {"mfu", m.mfu ? nlohmann::json(*m.mfu) : nlohmann::json()},
                         {"memory_mb", m.memory_mb},
                         {"comm_ms", m.comm_ms},
                         {"exposed_comm_ms", m.exposed_comm_ms},
                         {"optimizer_state_mb", m.optimizer_state_mb},
                         {"skipped", m.skipped}};
  if (m.predicted_step_ms) line["predicted_step_ms"] = *m.predicted_step_ms;
  if (m.pipeline_bubble) {
    line["pipeline_bubble"] = *m.pipeline_bubble;
    line["pipeline_bubble_theory"] = m.pipeline_bubble_theory;
    line["stage_memory_mb"] = m.stage_memory_mb;
  }
  return line;
}

MetricsLogger::MetricsLogger(int64_t total_steps, int64_t print_every, const std::string& metrics_file,
                             const std::string& progress, bool enabled, int64_t first_step)
    : total_steps_(total_steps), enabled_(enabled), print_every_(std::max<int64_t>(print_every, 1)),
      start_(std::chrono::steady_clock::now()) {
  bar_ = progress == "bar" || (progress == "auto" && isatty(STDOUT_FILENO));
  if (!metrics_file.empty()) {
    std::string kept;  // a resumed run keeps the lines of the steps before it
    if (first_step > 1) {
      std::ifstream previous(metrics_file);
      for (std::string line; std::getline(previous, line);) {
        const nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (entry.is_object() && entry.contains("step") && entry["step"].is_number_integer() &&
            entry["step"].get<int64_t>() < first_step) {
          kept += line + "\n";
        }
      }
    }
    metrics_.open(metrics_file, std::ios::trunc);
    metrics_ << kept;
    WEFT_CHECK(metrics_.good(), "log.metrics_file: cannot open '", metrics_file, "' for writing");
  }
}

MetricsLogger::~MetricsLogger() { end_bar_line(); }

void MetricsLogger::end_bar_line() {
  if (bar_line_open_) {
    std::printf("\n");
    std::fflush(stdout);
    bar_line_open_ = false;
  }
}

void MetricsLogger::log_step(const StepMetrics& m) {
  if (!enabled_) return;
  if (metrics_.is_open()) {
    metrics_ << step_metrics_json(m).dump() << "\n";
    metrics_.flush();
  }
  if (first_step_ < 0) {
    first_step_ = m.step;
    start_ = std::chrono::steady_clock::now();
  }
  if (m.step % print_every_ != 0 && m.step != total_steps_) return;
  const std::string mfu = m.mfu ? absl::StrFormat("  mfu %.1f%%", 100 * *m.mfu) : "";
  const std::string numbers =
      absl::StrFormat("loss %.4f  lr %.3g  grad %.3f  %.0f tok/s  %.0f ms%s%s%s%s  mem %.0f MB%s", m.loss, m.lr,
                      m.grad_norm, m.tokens_per_s, m.step_ms,
                      m.predicted_step_ms ? absl::StrFormat(" (predicted %.0f)", *m.predicted_step_ms) : "", mfu,
                      m.comm_ms > 0 ? absl::StrFormat("  comm %.1f ms (exposed %.1f)", m.comm_ms, m.exposed_comm_ms) : "",
                      m.pipeline_bubble ? absl::StrFormat("  bubble %.1f%% (theory %.1f%%)  stage mem %s MB",
                                                          100 * *m.pipeline_bubble, 100 * m.pipeline_bubble_theory,
                                                          absl::StrJoin(m.stage_memory_mb, "/", [](std::string* out, double mb) {
                                                            absl::StrAppend(out, absl::StrFormat("%.0f", mb));
                                                          }))
                                        : "",
                      m.memory_mb, skip_note(m));
  if (!bar_) {
    std::printf("step %6lld/%lld  %s\n", static_cast<long long>(m.step), static_cast<long long>(total_steps_),
                numbers.c_str());
    std::fflush(stdout);
    return;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double done = static_cast<double>(m.step - first_step_ + 1);
  const double eta = elapsed / done * static_cast<double>(total_steps_ - m.step);
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * static_cast<double>(m.step) / static_cast<double>(total_steps_));
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::printf("\r[%s] %lld/%lld  %s  eta %s   ", bar.c_str(), static_cast<long long>(m.step),
              static_cast<long long>(total_steps_), numbers.c_str(), format_duration(eta).c_str());
  std::fflush(stdout);
  bar_line_open_ = true;
}

void MetricsLogger::log_validation(int64_t step, double loss) {
  if (!enabled_) return;
  if (metrics_.is_open()) {
    metrics_ << nlohmann::json{{"step", step}, {"val_loss", number(loss)}}.dump() << "\n";
    metrics_.flush();
  }
  log_event(absl::StrFormat("step %lld  validation loss %.4f", static_cast<long long>(step), loss));
}

void MetricsLogger::log_event(const std::string& text) {
  if (!enabled_) return;
  end_bar_line();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace weft
