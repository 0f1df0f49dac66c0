// Trainer: one training run in one process, from a RunConfig — the loop behind weft-train.
//
// It builds the model (layers/), the optimizer and schedule (optim/), the datasets, then runs
// train.steps optimizer steps of train.micro_batches micro-batches each: forward, loss, backward
// (gradients accumulate), clip, update. It logs each step (launcher/metrics_logger.h), measures the
// validation loss every data.val_every steps, and saves checkpoints (launcher/checkpoint.h) holding
// the model, the optimizer state, the data position and every dropout stream, so that a resumed run
// on the CPU continues bit-exactly where the saved one stopped. A stop signal ends the loop at a
// step boundary with a checkpoint (launcher/stop_signal.h, launcher/step_agreement.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/metrics_logger.h"
#include "launcher/run_config.h"
#include "layers/language_model.h"
#include "parallel/cost/cost_model.h"

namespace weft {

struct TrainResult {
  int64_t first_step = 0;           // the first step this run executed (1 unless resumed)
  int64_t last_step = 0;
  std::vector<double> losses;       // training loss of each executed step
  // Every executed step's metrics, on every rank: times and memory_mb are this rank's own (rank
  // 0's are the ones logged), the loss is the global batch's.
  std::vector<StepMetrics> steps;
  // The start-up lines about the parallel layout, as logged: the strategy's description() lines
  // and the auto mode's tensor-parallel plan (weft-compare reports them).
  std::vector<std::string> description;
  std::optional<double> last_validation_loss;
  bool stopped_by_signal = false;   // the ranks agreed to stop early (SIGTERM/SIGINT; launcher/stop_signal.h)
  // The cost-model figures the run chose and predicted by (null: it had none).
  std::shared_ptr<const CostModel> cost_model;
};

class Trainer {
 public:
  // Validates what only a run can check (device present, data vocabulary vs model.vocab).
  // `cost_model`, when given, is the run's cost model instead of what comm.calibrate and
  // comm.calibration_file would give (weft-compare gives its auto run the figures its manual run
  // measured: one calibration, both predictions from the same figures).
  explicit Trainer(RunConfig config, std::shared_ptr<const CostModel> cost_model = nullptr);
  ~Trainer();
  TrainResult run();
  LanguageModel& model() { return *model_; }

 private:
  struct State;
  RunConfig config_;
  std::shared_ptr<LanguageModel> model_;
  std::unique_ptr<State> state_;
};

// The step a run would resume from for `config` ("" when checkpoint.resume is empty or finds none).
std::string resolve_resume_path(const RunConfig& config);

}  // namespace weft
