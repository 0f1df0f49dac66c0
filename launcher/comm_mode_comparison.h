// The comparison weft-compare reports: the same run (config, seeds, data) in comm.mode manual and
// in auto, reduced to the figures a reader weighs — throughput, where the step's time went, the
// memory each rank needed, and whether the two modes computed the same losses — as one table for
// the terminal and as JSON for comparing runs later.
//
// Invariants:
// - A ModeRun holds rank 0's metrics of every step (what weft-train logs), and every rank's peak
//   memory and mean exposed communication (a rank that waits for a slower one shows it there);
//   both runs executed the same steps, from step 1.
// - Means are over the measured steps: all but the first warm_up_steps() (the first steps pay for
//   first touches of memory, communicators created at first use, ...). Overlap is
//   1 - mean exposed / mean communication: a ratio of times, so long steps weigh more.
// - Communication is what the step graph times as collectives (gradient buckets, ZeRO gathers,
//   pipeline sends and receives). Tensor-parallel collectives are issued inside forward and
//   backward segments and count as their compute; the table says so when tp > 1.
// - Losses agree "bitwise" only when every step's double is identical: on the CPU both modes run
//   the same kernels on the same data in the same order wherever they promise to (data
//   parallelism, tensor parallelism without sp); otherwise the largest relative difference and its
//   step say how far apart they are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/metrics_logger.h"
#include "launcher/run_config.h"
#include "nlohmann/json.hpp"

namespace weft {

// One comm mode's run as weft-compare saw it.
struct ModeRun {
  std::string mode;                                // "manual" or "auto"
  std::vector<StepMetrics> steps;                  // rank 0's, one per executed step, step 1 first
  std::vector<std::string> description;            // the trainer's start-up lines on the layout
  std::vector<double> peak_memory_mb_per_rank;     // each rank's largest memory_mb, rank 0 first
  std::vector<double> exposed_comm_ms_per_rank;    // each rank's mean over its measured steps
};

// The means of one mode over its measured steps.
struct ModeFigures {
  int64_t measured_steps = 0;
  double tokens_per_s = 0;
  double step_ms = 0;
  double compute_ms = 0;
  double comm_ms = 0;
  double exposed_comm_ms = 0;
  double largest_exposed_comm_ms = 0;              // the largest rank's mean (rank 0's without them)
  std::optional<double> overlap;                   // empty when the mode did not communicate
  std::optional<double> pipeline_bubble;           // pipelines only
  std::optional<double> pipeline_bubble_theory;
  std::optional<double> mfu;                       // GPUs only
  double peak_memory_mb = 0;                       // the largest over ranks
  std::optional<double> predicted_step_ms;         // the cost model's, when the run had one
};

// The steps left out of the means: the first 2 when a run has more than 3 steps, else none (too
// few to drop any).
int64_t warm_up_steps(int64_t steps);

ModeFigures mode_figures(const ModeRun& run);

struct LossAgreement {
  bool bitwise = true;                   // every step's loss is the same double in both modes
  double max_relative_difference = 0;    // |a - b| / |a| at its worst (0 when bitwise)
  int64_t step_of_max = 0;               // the step where it is largest (0 when bitwise)
  int64_t steps_compared = 0;
};

// Step by step over the steps both runs executed.
LossAgreement compare_losses(const ModeRun& manual, const ModeRun& automatic);

// What the table and the JSON say about the run besides the two modes' figures.
struct ComparisonContext {
  RunConfig config;                      // as run (comm.mode aside)
  int world_size = 1;
  std::vector<std::string> config_files;
  std::vector<std::string> overrides;
  int tensor_parallel_block_lines_manual = 0;  // tools/tp_block_lines.py, at build time
  int tensor_parallel_block_lines_auto = 0;
};

// The table rank 0 prints: a header line on the run, rows of figures with the columns manual,
// auto and auto / manual, then the notes (warm-up steps, how memory is measured, the losses'
// verdict, the tensor-parallel block's lines of code). Ends in a newline.
std::string comparison_table(const ComparisonContext& context, const ModeRun& manual, const ModeRun& automatic);

// Everything in the table and more, for later comparisons: the config summary and its YAML, each
// mode's step rows (the metrics file's objects), means, description and per-rank peak memory, the
// losses' agreement and the line counts.
nlohmann::json comparison_json(const ComparisonContext& context, const ModeRun& manual, const ModeRun& automatic);

// The one-line verdict on the losses: "bitwise equal over N steps", or on the CPU "differ: max
// relative difference X at step S", on GPUs "max relative difference X at step S".
std::string loss_verdict(const LossAgreement& agreement, bool on_gpu);

}  // namespace weft
