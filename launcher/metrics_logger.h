// MetricsLogger: what a training run reports each step, on the terminal and in a JSON-lines file.
//
// Every step appends one JSON object to log.metrics_file (when set) with at least step, loss, lr,
// grad_norm, tokens_per_s, step_ms, elapsed_s, compute_ms, mfu (null without a GPU peak to divide
// by), memory_mb, comm_ms and exposed_comm_ms (0 in one process): step_metrics_json. Every log.every
// steps a line is printed: on a terminal (or progress: bar) a progress bar with ETA redrawn in
// place, otherwise plain lines that read well in CI logs and files. Validation losses and events
// print on their own lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace weft {

struct StepMetrics {
  int64_t step = 0;         // 1-based optimizer step
  double loss = 0;          // mean training loss over the step's micro-batches
  double lr = 0;
  double grad_norm = 0;     // before clipping
  double tokens_per_s = 0;
  double step_ms = 0;       // from the later of its issue and the last step's end, to its end
  // Seconds from the run's first issued step to this step's end: differences between steps are
  // wall time, the host's work between steps included (which step_ms leaves out with one step in
  // flight).
  double elapsed_s = 0;
  double compute_ms = 0;    // time the step computed (union of its compute nodes), this rank
  std::optional<double> mfu;  // model FLOPs utilization in [0, 1]; empty on the CPU
  double memory_mb = 0;     // resident host memory (CPU) or peak device memory (GPU)
  double comm_ms = 0;
  double exposed_comm_ms = 0;
  double optimizer_state_mb = 0;  // optimizer state kept by this rank (ZeRO shards it)
  bool skipped = false;     // the update was skipped (non-finite loss or gradient norm, on_nan: skip)
  // Pipelines: the measured bubble (mean over stages of each stage's idle share of the pipeline's
  // span, parallel/pipeline/pipeline_stage.h) and the schedule's bubble in theory.
  std::optional<double> pipeline_bubble;
  double pipeline_bubble_theory = 0;
  std::vector<double> stage_memory_mb;  // pipelines: memory_mb of every stage, stage 0 first
  // The cost model's prediction of step_ms (parallel/cost/step_simulator.h), when the run has one.
  std::optional<double> predicted_step_ms;
};

// One step's line of the metrics file, as JSON (non-finite numbers as null). weft-compare writes
// the same objects into its comparison.json.
nlohmann::json step_metrics_json(const StepMetrics& metrics);

class MetricsLogger {
 public:
  // progress: "auto" (bar on a terminal), "bar" or "plain". A logger that is not enabled (ranks
  // other than 0 of a distributed run) prints and writes nothing.
  // A run that starts at step 1 starts a new metrics file; a resumed run (first_step > 1) appends
  // to it after dropping the lines of steps it will run again, so every step appears once.
  MetricsLogger(int64_t total_steps, int64_t print_every, const std::string& metrics_file,
                const std::string& progress, bool enabled = true, int64_t first_step = 1);
  ~MetricsLogger();
  void log_step(const StepMetrics& metrics);
  void log_validation(int64_t step, double loss);
  // A line of text (checkpoint saved, resumed, ...), printed without disturbing the bar.
  void log_event(const std::string& text);

 private:
  void end_bar_line();

  int64_t total_steps_;
  bool enabled_;
  int64_t print_every_;
  bool bar_;
  bool bar_line_open_ = false;
  std::ofstream metrics_;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = -1;
};

}  // namespace weft
