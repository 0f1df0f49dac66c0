// The figures, the table and the JSON of weft-compare (comm_mode_comparison.h).
#include "launcher/comm_mode_comparison.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/config_loader.h"

namespace weft {
namespace {

bool runs_on_gpu(const RunConfig& config) { return config.train.device != "cpu"; }

// The steps that count in the means.
std::vector<const StepMetrics*> measured(const ModeRun& run) {
  std::vector<const StepMetrics*> out;
  const int64_t skipped = warm_up_steps(static_cast<int64_t>(run.steps.size()));
  for (size_t i = static_cast<size_t>(skipped); i < run.steps.size(); ++i) out.push_back(&run.steps[i]);
  return out;
}

template <class Field>
double mean_of(const std::vector<const StepMetrics*>& steps, Field field) {
  if (steps.empty()) return 0;
  double total = 0;
  for (const StepMetrics* step : steps) total += field(*step);
  return total / static_cast<double>(steps.size());
}

// JSON has no NaN: an absent figure is null.
nlohmann::json optional_number(const std::optional<double>& value) {
  return value && std::isfinite(*value) ? nlohmann::json(*value) : nlohmann::json();
}

// "1.07", or "" where a ratio says nothing (a figure absent or zero in the manual mode).
std::string ratio(double manual, double automatic) {
  return manual > 0 && std::isfinite(automatic / manual) ? absl::StrFormat("%.2f", automatic / manual) : "";
}

struct Row {
  std::string label, manual, automatic, ratio;
};

std::string render_rows(const std::vector<Row>& rows) {
  size_t label_width = 0, manual_width = std::string("manual").size(), auto_width = std::string("auto").size();
  for (const Row& row : rows) {
    label_width = std::max(label_width, row.label.size());
    manual_width = std::max(manual_width, row.manual.size());
    auto_width = std::max(auto_width, row.automatic.size());
  }
  std::string out;
  for (const Row& row : rows) {
    const std::string line = absl::StrFormat("%-*s  %*s  %*s  %*s", static_cast<int>(label_width), row.label,
                                             static_cast<int>(manual_width), row.manual,
                                             static_cast<int>(auto_width), row.automatic, 13, row.ratio);
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

nlohmann::json figures_json(const ModeFigures& figures) {
  return {{"measured_steps", figures.measured_steps},
          {"tokens_per_s", figures.tokens_per_s},
          {"step_ms", figures.step_ms},
          {"predicted_step_ms", optional_number(figures.predicted_step_ms)},
          {"compute_ms", figures.compute_ms},
          {"comm_ms", figures.comm_ms},
          {"exposed_comm_ms", figures.exposed_comm_ms},
          {"largest_exposed_comm_ms", figures.largest_exposed_comm_ms},
          {"overlap", optional_number(figures.overlap)},
          {"pipeline_bubble", optional_number(figures.pipeline_bubble)},
          {"pipeline_bubble_theory", optional_number(figures.pipeline_bubble_theory)},
          {"mfu", optional_number(figures.mfu)},
          {"peak_memory_mb", figures.peak_memory_mb}};
}

nlohmann::json mode_json(const ModeRun& run) {
  nlohmann::json steps = nlohmann::json::array();
  std::vector<double> losses;
  for (const StepMetrics& step : run.steps) {
    steps.push_back(step_metrics_json(step));
    losses.push_back(step.loss);
  }
  return {{"description", run.description},
          {"steps", steps},
          {"means", figures_json(mode_figures(run))},
          {"peak_memory_mb_per_rank", run.peak_memory_mb_per_rank},
          {"exposed_comm_ms_per_rank", run.exposed_comm_ms_per_rank},
          {"losses", losses}};
}

}  // namespace

int64_t warm_up_steps(int64_t steps) { return steps > 3 ? 2 : 0; }

ModeFigures mode_figures(const ModeRun& run) {
  const std::vector<const StepMetrics*> steps = measured(run);
  ModeFigures figures;
  figures.measured_steps = static_cast<int64_t>(steps.size());
  figures.tokens_per_s = mean_of(steps, [](const StepMetrics& m) { return m.tokens_per_s; });
  figures.step_ms = mean_of(steps, [](const StepMetrics& m) { return m.step_ms; });
  if (!steps.empty() && steps.front()->predicted_step_ms) figures.predicted_step_ms = *steps.front()->predicted_step_ms;
  figures.compute_ms = mean_of(steps, [](const StepMetrics& m) { return m.compute_ms; });
  figures.comm_ms = mean_of(steps, [](const StepMetrics& m) { return m.comm_ms; });
  figures.exposed_comm_ms = mean_of(steps, [](const StepMetrics& m) { return m.exposed_comm_ms; });
  if (figures.comm_ms > 0) figures.overlap = 1.0 - figures.exposed_comm_ms / figures.comm_ms;
  if (!steps.empty() && steps.front()->pipeline_bubble) {
    figures.pipeline_bubble = mean_of(steps, [](const StepMetrics& m) { return m.pipeline_bubble.value_or(0); });
    figures.pipeline_bubble_theory = mean_of(steps, [](const StepMetrics& m) { return m.pipeline_bubble_theory; });
  }
  if (!steps.empty() && steps.front()->mfu) {
    figures.mfu = mean_of(steps, [](const StepMetrics& m) { return m.mfu.value_or(0); });
  }
  for (double megabytes : run.peak_memory_mb_per_rank) figures.peak_memory_mb = std::max(figures.peak_memory_mb, megabytes);
  figures.largest_exposed_comm_ms = figures.exposed_comm_ms;
  for (double ms : run.exposed_comm_ms_per_rank) {
    figures.largest_exposed_comm_ms = std::max(figures.largest_exposed_comm_ms, ms);
  }
  return figures;
}

LossAgreement compare_losses(const ModeRun& manual, const ModeRun& automatic) {
  LossAgreement agreement;
  const size_t count = std::min(manual.steps.size(), automatic.steps.size());
  agreement.steps_compared = static_cast<int64_t>(count);
  for (size_t i = 0; i < count; ++i) {
    const double a = manual.steps[i].loss, b = automatic.steps[i].loss;
    // Bits, not values: -0.0 == 0.0 and NaN != NaN would both mislead.
    if (std::memcmp(&a, &b, sizeof(double)) == 0) continue;
    agreement.bitwise = false;
    double difference = a == 0 ? std::fabs(b) : std::fabs(a - b) / std::fabs(a);
    // A loss that is not finite in one mode (or in both, differently) is the worst difference there is.
    if (std::isnan(difference)) difference = HUGE_VAL;
    if (agreement.step_of_max == 0 || difference > agreement.max_relative_difference) {
      agreement.max_relative_difference = difference;
      agreement.step_of_max = manual.steps[i].step;
    }
  }
  return agreement;
}

std::string loss_verdict(const LossAgreement& agreement, bool on_gpu) {
  if (agreement.bitwise) {
    return absl::StrFormat("bitwise equal over %lld steps", static_cast<long long>(agreement.steps_compared));
  }
  return absl::StrFormat("%smax relative difference %.3g at step %lld", on_gpu ? "" : "differ: ",
                         agreement.max_relative_difference, static_cast<long long>(agreement.step_of_max));
}

std::string comparison_table(const ComparisonContext& context, const ModeRun& manual, const ModeRun& automatic) {
  const RunConfig& config = context.config;
  const ParallelConfig& parallel = config.parallel;
  const ModeFigures a = mode_figures(manual), b = mode_figures(automatic);
  const LossAgreement losses = compare_losses(manual, automatic);
  const bool on_gpu = runs_on_gpu(config);
  const int64_t steps = static_cast<int64_t>(manual.steps.size());

  std::string out = absl::StrFormat(
      "weft-compare: %d rank(s): dp %lld, tp %lld%s, pp %lld%s, zero %lld; %s model, %lld layers, dim %lld, on %s "
      "in %s; %lld steps of %lld x %lld tokens\n",
      context.world_size, static_cast<long long>(parallel.dp), static_cast<long long>(parallel.tp),
      parallel.sp ? " with sp" : "", static_cast<long long>(parallel.pp),
      parallel.pp > 1 ? absl::StrFormat(" (%s, %lld micro-batches)", parallel.pp_schedule,
                                        static_cast<long long>(config.train.micro_batches))
                      : "",
      static_cast<long long>(parallel.zero), config.model.type, static_cast<long long>(config.model.layers),
      static_cast<long long>(config.model.dim), config.train.device, config.train.dtype,
      static_cast<long long>(steps), static_cast<long long>(config.train.batch_size),
      static_cast<long long>(config.model.seq_len));

  auto ms = [](double value) { return absl::StrFormat("%.2f", value); };
  auto share = [](const std::optional<double>& value) {
    return value ? absl::StrFormat("%.1f%%", 100 * *value) : std::string("-");
  };
  std::vector<Row> rows = {
      {"", "manual", "auto", "auto / manual"},
      {"tokens/s", absl::StrFormat("%.0f", a.tokens_per_s), absl::StrFormat("%.0f", b.tokens_per_s),
       ratio(a.tokens_per_s, b.tokens_per_s)},
      {"step ms", ms(a.step_ms), ms(b.step_ms), ratio(a.step_ms, b.step_ms)},
      {"  predicted by the cost model", a.predicted_step_ms ? ms(*a.predicted_step_ms) : "-",
       b.predicted_step_ms ? ms(*b.predicted_step_ms) : "-", ""},
      {"compute ms", ms(a.compute_ms), ms(b.compute_ms), ratio(a.compute_ms, b.compute_ms)},
      {"communication ms", ms(a.comm_ms), ms(b.comm_ms), ratio(a.comm_ms, b.comm_ms)},
      {"exposed communication ms", ms(a.exposed_comm_ms), ms(b.exposed_comm_ms),
       ratio(a.exposed_comm_ms, b.exposed_comm_ms)},
      {"  largest rank", ms(a.largest_exposed_comm_ms), ms(b.largest_exposed_comm_ms),
       ratio(a.largest_exposed_comm_ms, b.largest_exposed_comm_ms)},
      {"overlap (1 - exposed / comm)", share(a.overlap), share(b.overlap), ""},
  };
  if (a.pipeline_bubble || b.pipeline_bubble) {
    rows.push_back({"pipeline bubble, measured", share(a.pipeline_bubble), share(b.pipeline_bubble),
                    ratio(a.pipeline_bubble.value_or(0), b.pipeline_bubble.value_or(0))});
    rows.push_back({"pipeline bubble, theory", share(a.pipeline_bubble_theory), share(b.pipeline_bubble_theory), ""});
  }
  rows.push_back({"peak memory MB (largest rank)", absl::StrFormat("%.1f", a.peak_memory_mb),
                  absl::StrFormat("%.1f", b.peak_memory_mb), ratio(a.peak_memory_mb, b.peak_memory_mb)});
  if (on_gpu) rows.push_back({"MFU", share(a.mfu), share(b.mfu), ratio(a.mfu.value_or(0), b.mfu.value_or(0))});
  if (steps > 0 && !automatic.steps.empty()) {
    rows.push_back({absl::StrFormat("loss at step %lld", static_cast<long long>(manual.steps.back().step)),
                    absl::StrFormat("%.6f", manual.steps.back().loss),
                    absl::StrFormat("%.6f", automatic.steps.back().loss),
                    losses.bitwise ? "bitwise" : absl::StrFormat("%.1e rel.", losses.max_relative_difference)});
  }
  out += render_rows(rows);

  const int64_t skipped = warm_up_steps(steps);
  out += skipped > 0 ? absl::StrFormat("means over steps %lld-%lld; the first %lld are warm-up and left out\n",
                                       static_cast<long long>(skipped + 1), static_cast<long long>(steps),
                                       static_cast<long long>(skipped))
                     : absl::StrFormat("means over all %lld steps (too few to leave warm-up steps out)\n",
                                       static_cast<long long>(steps));
  out += "times are rank 0's, as weft-train logs them; \"largest rank\": the rank with the most exposed "
         "communication (a rank waiting for a slower one)\n";
  out += "losses: " + loss_verdict(losses, on_gpu) + "\n";
  if (parallel.tp > 1) {
    // A tensor-parallel collective runs inside the segment that issues it; the tp group records it
    // and where compute stood still for it (parallel/comm/traced_process_group.h).
    out += on_gpu ? "communication: tensor-parallel collectives included (recorded inside the segments that issue "
                    "them, on their own stream; exposed where the compute stream waited for them)\n"
                  : "communication: tensor-parallel collectives included (recorded inside the segments that issue "
                    "them; exposed where the compute thread waited for them)\n";
  }
  out += on_gpu ? "memory: each rank's peak of device memory allocated in a step\n"
                : "memory: each process's resident host memory; the auto run follows the manual one in the same "
                  "process\n";
  out += absl::StrFormat("tensor-parallel block: manual %d lines, auto %d lines (tools/tp_block_lines.py)\n",
                         context.tensor_parallel_block_lines_manual, context.tensor_parallel_block_lines_auto);
  // What each mode took from the cost model, as its start-up log says it: the manual mode's fixed
  // dp path (where the world spans hosts) and its prediction; the auto mode's choices (bucket size,
  // dp all-reduce path, collective matmuls) and its prediction.
  auto cost_model_lines = [&out](const std::vector<std::string>& description, const std::string& heading) {
    bool headed = false;
    for (const std::string& line : description) {
      if (line.rfind("cost model: ", 0) != 0 && line.rfind("dp all-reduce", 0) != 0 &&
          line.rfind("collective matmuls", 0) != 0) {
        continue;
      }
      if (!headed) out += heading + "\n";
      headed = true;
      out += "  " + (line.rfind("cost model: ", 0) == 0 ? line.substr(12) : line) + "\n";
    }
  };
  cost_model_lines(manual.description, "the manual mode's path and prediction:");
  cost_model_lines(automatic.description, "the auto mode's choices:");
  return out;
}

nlohmann::json comparison_json(const ComparisonContext& context, const ModeRun& manual, const ModeRun& automatic) {
  const RunConfig& config = context.config;
  const LossAgreement losses = compare_losses(manual, automatic);
  const int64_t steps = static_cast<int64_t>(manual.steps.size());
  const nlohmann::json summary = {
      {"files", context.config_files},
      {"overrides", context.overrides},
      {"ranks", context.world_size},
      {"dp", config.parallel.dp},
      {"tp", config.parallel.tp},
      {"pp", config.parallel.pp},
      {"zero", config.parallel.zero},
      {"sp", config.parallel.sp},
      {"pp_schedule", config.parallel.pp_schedule},
      {"pp_virtual", config.parallel.pp_virtual},
      {"micro_batches", config.train.micro_batches},
      {"batch_size", config.train.batch_size},
      {"steps", steps},
      {"device", config.train.device},
      {"dtype", config.train.dtype},
      {"bucket_mb", config.comm.bucket_mb},
      {"model",
       {{"type", config.model.type},
        {"layers", config.model.layers},
        {"dim", config.model.dim},
        {"heads", config.model.heads},
        {"kv_heads", config.model.kv_heads},
        {"vocab", config.model.vocab},
        {"seq_len", config.model.seq_len}}},
      // The whole merged config both runs shared (each with its own comm.mode), loadable by weft-train.
      {"yaml", dump_config(config)}};
  return {{"program", "weft-compare"},
          {"config", summary},
          {"warm_up_steps", warm_up_steps(steps)},
          {"modes", {{"manual", mode_json(manual)}, {"auto", mode_json(automatic)}}},
          {"losses",
           {{"bitwise", losses.bitwise},
            {"max_relative_difference", losses.max_relative_difference},
            {"step_of_max", losses.step_of_max},
            {"steps_compared", losses.steps_compared},
            {"verdict", loss_verdict(losses, runs_on_gpu(config))}}},
          {"tensor_parallel_block_lines",
           {{"manual", context.tensor_parallel_block_lines_manual},
            {"auto", context.tensor_parallel_block_lines_auto},
            {"counted_by", "tools/tp_block_lines.py"}}}};
}

}  // namespace weft
