#include "launcher/trainer.h"

#include <unistd.h>

#include <filesystem>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/calibration_file.h"
#include "launcher/checkpoint.h"
#include "launcher/checkpoint_staging.h"
#include "launcher/checkpoint_writer.h"
#include "launcher/config_loader.h"
#include "launcher/dataset.h"
#include "launcher/cost_model_setup.h"
#include "launcher/cpu_threads.h"
#include "parallel/cost/host_topology.h"
#include "launcher/metrics_logger.h"
#include "launcher/pretrained_weights.h"
#include "launcher/step_agreement.h"
#include "launcher/stop_signal.h"
#include "launcher/text_dataset.h"
#include "launcher/token_shard_dataset.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/comm/gpu_assignment.h"
#include "parallel/comm/host_staged_process_group.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_poll_probe.h"
#include "parallel/mesh.h"
#include "parallel/step/fault_injection.h"
#include "parallel/strategy.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/clock.h"
#include "runtime/determinism.h"
#include "runtime/error.h"
#include "runtime/ops/loss.h"

namespace weft {
namespace {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";

// Resident host memory of this process in MB (from /proc; 0 where unavailable).
double resident_megabytes() {
  std::ifstream statm("/proc/self/statm");
  long long pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

// Training FLOPs per token: 6 per parameter (forward + backward of every matmul weight, the tied
// output projection included) plus causal attention's score and value products,
// 6 * layers * T * C (12 * L * T * C for full attention, halved by the mask).
double flops_per_token(const ModelConfig& model, int64_t parameters) {
  return 6.0 * static_cast<double>(parameters) +
         6.0 * static_cast<double>(model.layers * model.seq_len * model.dim);
}

// The Hopper datasheet's dense bf16 peak, the figure DESIGN.md asks MFU against.
constexpr double kGpuPeakFlops = 989e12;

std::map<std::string, Tensor> with_prefix(const std::map<std::string, Tensor>& tensors, const std::string& prefix) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : tensors) out[prefix + name] = tensor;
  return out;
}

std::map<std::string, Tensor> strip_prefix(const std::map<std::string, Tensor>& tensors, const std::string& prefix) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind(prefix, 0) == 0) out[name.substr(prefix.size())] = tensor;
  }
  return out;
}

// Memory for the step log: resident host memory on the CPU; on a device the peak of device memory
// handed out by its allocator since the previous step.
double memory_megabytes(Device device) {
  if (device.is_cpu()) return resident_megabytes();
  const DeviceMemory memory = backend_for(device).memory(device, /*reset_peak=*/true);
  return static_cast<double>(memory.peak_allocated_bytes) / (1024.0 * 1024.0);
}

// A value of a checkpoint's state.json, or an error naming the file and the key.
template <class Value>
Value state_value(const LoadedCheckpoint& checkpoint, const std::string& key) {
  try {
    return checkpoint.state.at(key).get<Value>();
  } catch (const nlohmann::json::exception& error) {
    WEFT_FAIL("checkpoint ", checkpoint.path, ": state.json has no valid '", key, "' (", error.what(),
              "); the checkpoint is corrupt or was not written by weft-train");
  }
}

// WEFT_FAULT's name for a point of a checkpoint save.
FaultInjection::Phase checkpoint_fault_phase(CheckpointPhase phase) {
  switch (phase) {
    case CheckpointPhase::kTensors: return FaultInjection::Phase::kCheckpointTensors;
    case CheckpointPhase::kState: return FaultInjection::Phase::kCheckpointState;
    case CheckpointPhase::kRename: return FaultInjection::Phase::kCheckpointRename;
    case CheckpointPhase::kLatest: return FaultInjection::Phase::kCheckpointLatest;
  }
  return FaultInjection::Phase::kCheckpointTensors;
}

}  // namespace

struct Trainer::State {
  int world_rank = 0;
  int world_size = 1;
  std::unique_ptr<Strategy> strategy;  // how the step is spread over the ranks (one process too)
  Device device;
  DType compute_dtype = kFloat32;
  std::unique_ptr<Dataset> train_data;
  std::unique_ptr<Dataset> validation_data;
  DatasetPosition validation_start;
  std::unique_ptr<LearningRateSchedule> schedule;
  std::vector<std::string> tensor_plan;  // the auto mode's applied tensor-parallel plan, for the log
  std::optional<FaultInjection> fault;  // WEFT_FAULT, for the checkpoint phases (tests)
  int64_t start_step = 0;  // steps already done (from a checkpoint)
  CostModelSetup cost;     // the cost model (comm.calibrate, comm.calibration_file), if any
  std::vector<std::string> choices;  // what the run chose from it outside the strategy, for the log
  int steps_in_flight = 1;  // train.steps_in_flight as resolved for this run and strategy
};

std::string resolve_resume_path(const RunConfig& config) {
  const std::string& resume = config.checkpoint.resume;
  if (resume.empty()) return "";
  if (resume == "latest") return latest_checkpoint(config.checkpoint.dir);
  return resume;
}

Trainer::Trainer(RunConfig config, std::shared_ptr<const CostModel> cost_model)
    : config_(std::move(config)), state_(std::make_unique<State>()) {
  validate_config(config_);
  State& s = *state_;
  // The world: under mpirun every rank builds the same mesh and fails with the same message when
  // the sizes do not fit (a deterministic check, so no rank waits for another).
  s.world_rank = mpi_world_rank();
  s.world_size = mpi_world_size();
  const Mesh mesh(static_cast<int>(config_.parallel.dp), static_cast<int>(config_.parallel.pp),
                  static_cast<int>(config_.parallel.tp), s.world_size);
  s.device = Device::parse(config_.train.device);
  if (s.device.is_cuda() && MpiEnvironment::current() != nullptr) {
    // One GPU per rank of a host: local_rank % visible GPUs (or the cuda:N named), refused where two
    // ranks would share one, unless the collectives go through the host.
    GpuAssignmentOptions gpus;
    if (config_.train.device != "cuda") gpus.device = s.device.index;
    gpus.sharing_allowed = gpu_collectives_through_host();
    s.device = Device::cuda(gpu_of_this_rank(gpus));
  }
  s.compute_dtype = parse_dtype(config_.train.dtype);
  // Before anything runs a kernel: the calibration's matmuls would otherwise be tuned by timing.
  if (config_.train.deterministic) set_deterministic_kernels(true);
  if (deterministic_kernels() && s.device.is_cuda()) {
    s.choices.push_back(
        "deterministic kernels (train.deterministic): cuDNN's deterministic attention backward, the flash kernels' "
        "dQ summed in a fixed order, matmul autotuning off");
  }
  const ModelConfig& model_config = config_.model;
  if (s.device.is_cpu()) {
    const std::string threads = share_cpu_cores_between_ranks();
    if (!threads.empty()) s.choices.push_back(threads);
    // Before the calibration, whose figures should be taken the way the run will wait.
    const MpiPollChoice waits = choose_mpi_poll_pause();
    if (waits.measured) s.choices.push_back(waits.describe());
  }

  // Data first: a missing file should fail before any weights are drawn.
  if (config_.data.format == "text") {
    WEFT_CHECK(model_config.vocab >= 256, "model.vocab = ", model_config.vocab,
               " is smaller than the 256 byte values of data.format: text; set model.vocab: 256");
    TextDatasets datasets = open_text_datasets(config_.data.train, config_.data.val, config_.data.val_fraction,
                                               model_config.seq_len, config_.train.seed);
    s.train_data = std::move(datasets.train);
    s.validation_data = std::move(datasets.val);
  } else {
    TokenShardDatasets datasets =
        open_token_shard_datasets(config_.data.train, config_.data.val, config_.data.val_fraction, model_config.vocab,
                                  model_config.seq_len, config_.train.seed);
    s.train_data = std::move(datasets.train);
    s.validation_data = std::move(datasets.val);
  }
  const int dp_rank = mesh.coordinates(s.world_rank).dp;
  s.train_data->set_shard(dp_rank, mesh.dp());  // each rank reads its rows of every global batch
  if (s.validation_data) {
    s.validation_data->set_shard(dp_rank, mesh.dp());
    s.validation_start = s.validation_data->position();
  }

  // Measured now (every rank at once) or read from comm.calibration_file; the auto mode chooses
  // from it, and each step's predicted time comes from it.
  // A resumed run takes the figures the run it continues chose by, where it would measure again.
  const std::string resume_path = resolve_resume_path(config_);
  std::optional<LoadedCheckpoint> resumed;
  if (!resume_path.empty()) resumed = load_checkpoint_state(resume_path);
  if (cost_model != nullptr) {
    s.cost.host_ids = world_host_ids();
    s.cost.lines.push_back("cost model: figures given (" + cost_model->source + ")");
    s.cost.model = std::move(cost_model);
  } else {
    s.cost = prepare_cost_model(config_, s.device, s.compute_dtype, s.world_rank,
                                resumed.has_value() ? &resumed->state : nullptr);
  }

  // The one-process model, or (tp > 1) this rank's part of it in the comm mode's form.
  // train.recompute reaches the layers that own the activations through the config they are built from.
  ModelConfig built_model_config = model_config;
  built_model_config.recompute = config_.train.recompute;
  ParallelModel parallel_model = build_parallel_model(built_model_config, mesh, s.device, config_.comm.mode,
                                                      config_.parallel.sp, config_.parallel.tp_plan);
  model_ = parallel_model.model;
  s.tensor_plan = parallel_model.plan;
  if (config_.train.recompute != "none") {
    s.choices.push_back(str("activation recomputation: ", config_.train.recompute, " (train.recompute)"));
  }
  if (!model_config.init_from.empty() && resolve_resume_path(config_).empty()) {
    // Published weights, as full f32 tensors, each rank keeping its shards: before the cast, the
    // move to the device and the strategy, so every layout starts from the same weights. A resumed
    // run takes its weights from the checkpoint instead.
    for (std::string& line : load_pretrained_weights(*model_, parallel_model.tensor_parallel.get(),
                                                     model_config.init_from, model_config)) {
      s.choices.push_back(std::move(line));
    }
  }
  if (parallel_model.tensor_parallel != nullptr && config_.parallel.sp && config_.comm.mode == "auto") {
    s.choices.push_back(choose_ring_chunks(config_, *parallel_model.tensor_parallel, s.cost));
  }
  model_->set_random_shard(dp_rank, mesh.dp());  // the dropout masks one process would use
  if (s.compute_dtype != kFloat32) model_->to(s.compute_dtype);
  if (!s.device.is_cpu()) model_->to(s.device);

  const TrainConfig& train = config_.train;
  StrategyOptions options;
  options.comm_mode = config_.comm.mode;
  options.zero_stage = config_.parallel.zero;
  options.bucket_bytes = static_cast<int64_t>(config_.comm.bucket_mb * 1024.0 * 1024.0);  // 0: by device
  options.micro_batches = train.micro_batches;
  options.weight_decay = train.weight_decay;
  options.grad_clip = train.grad_clip;
  options.on_nan = train.on_nan;
  options.trace = !config_.log.trace_file.empty();
  options.tensor_parallel = parallel_model.tensor_parallel;
  options.sequence_parallel = config_.parallel.sp;
  options.pipeline.schedule = config_.parallel.pp_schedule;
  options.pipeline.chunks = config_.parallel.pp_virtual;
  options.pipeline.layers = config_.parallel.pp_layers;
  options.pipeline.transport = config_.parallel.pp_transport;
  options.pipeline.seq_len = model_config.seq_len;
  options.cost_model = s.cost.model;
  options.host_ids = s.cost.host_ids;
  options.dp_all_reduce = config_.comm.dp_all_reduce;
  options.micro_batch_tokens = micro_batch_tokens(config_);
  options.make_optimizer = [&train](std::vector<ParameterGroup> groups) {
    return train.optimizer == "adamw" ? make_adamw(std::move(groups), {train.beta1, train.beta2, train.eps})
                                      : make_sgd(std::move(groups), {train.momentum, false});
  };
  s.strategy = make_strategy(mesh, s.world_rank, *model_, options);
  // A GPU gains from a step issued while the last one runs (it does not wait at the boundary while
  // the host reads the loss and loads the batch); the CPU runs a step as it is issued.
  const int wanted_in_flight =
      train.steps_in_flight != 0 ? static_cast<int>(train.steps_in_flight) : (s.device.is_cuda() ? 2 : 1);
  s.steps_in_flight = std::min(wanted_in_flight, s.strategy->max_steps_in_flight());
  if (s.steps_in_flight > 1) {
    s.choices.push_back(str("steps in flight: ", s.steps_in_flight, " (train.steps_in_flight: each step is issued "
                            "before the last one's loss is read)"));
  } else if (wanted_in_flight > 1) {
    s.choices.push_back("steps in flight: 1 (train.steps_in_flight: a pipeline needs each step's report before the "
                        "next is issued)");
  }
  s.fault = FaultInjection::from_environment();
  // A warm-up longer than the run (a short smoke test of a long run's config) is cut to the run;
  // run() says so in the log.
  s.schedule = std::make_unique<LearningRateSchedule>(config_.train.lr,
                                                      std::min(config_.train.warmup_steps, config_.train.steps),
                                                      config_.train.steps, config_.train.schedule,
                                                      config_.train.min_lr_ratio);

  if (!config_.checkpoint.dir.empty()) {
    // Found now, not after a whole run: a folder that cannot take checkpoints, and a folder that
    // holds another run's checkpoints, which a fresh run would overwrite.
    const std::filesystem::path dir = config_.checkpoint.dir;
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    WEFT_CHECK(std::filesystem::is_directory(dir) && access(dir.c_str(), W_OK) == 0, "checkpoint.dir: cannot write "
               "checkpoints into '", config_.checkpoint.dir, "'", error ? str(" (", error.message(), ")") : "",
               "; choose a writable folder");
    WEFT_CHECK(!config_.checkpoint.resume.empty() || latest_checkpoint(config_.checkpoint.dir).empty(),
               "checkpoint.dir '", config_.checkpoint.dir, "' already holds checkpoints (latest: ",
               latest_checkpoint(config_.checkpoint.dir), "); set checkpoint.resume: latest to continue that run, "
               "or choose another folder");
  }
  if (!resume_path.empty()) {
    LoadedCheckpoint checkpoint = load_checkpoint(resume_path);
    // Checkpoints hold full tensors: any dp, tp and ZeRO stage resumes them (the strategy shards).
    s.strategy->load_model_state(strip_prefix(checkpoint.tensors, kModelPrefix));
    s.strategy->load_optimizer_state(strip_prefix(checkpoint.tensors, kOptimizerPrefix));
    s.train_data->seek(state_value<DatasetPosition>(checkpoint, "train_data"));
    model_->load_random_state(state_value<std::map<std::string, uint64_t>>(checkpoint, "random_state"));
    s.start_step = checkpoint.step;
    WEFT_CHECK(s.start_step <= config_.train.steps, "checkpoint ", checkpoint.path, " is at step ", s.start_step,
               ", past train.steps = ", config_.train.steps, "; raise train.steps to continue training");
  }
}

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  State& s = *state_;
  const TrainConfig& train = config_.train;
  const int64_t micro_batch = train.batch_size / train.micro_batches;
  const int64_t steps_per_sequence = config_.model.seq_len;
  const double tokens_per_step = static_cast<double>(train.batch_size * steps_per_sequence);
  // The whole model's parameters: a tensor-parallel rank holds 1 / tp of each split one.
  int64_t parameter_count = 0;
  for (const NamedParameter& parameter : model_->named_parameters()) {
    parameter_count += parameter.tensor.numel() * (parameter.layout.is_split() ? config_.parallel.tp : 1);
  }
  const double step_flops = tokens_per_step * flops_per_token(config_.model, parameter_count);
  const bool leader = s.world_rank == 0;  // prints, writes metrics and checkpoints

  MetricsLogger logger(train.steps, config_.log.every, leader ? config_.log.metrics_file : "",
                       config_.log.progress, /*enabled=*/leader, s.start_step + 1);
  logger.log_event(absl::StrFormat("weft-train: %s model, %lld parameters, %s on %s, %s; %lld steps of %lld x %lld "
                                   "tokens",
                                   config_.model.type, static_cast<long long>(parameter_count),
                                   dtype_name(s.compute_dtype), s.device.to_string(), s.train_data->describe(),
                                   static_cast<long long>(train.steps), static_cast<long long>(train.batch_size),
                                   static_cast<long long>(steps_per_sequence)));
  const double optimizer_mb = static_cast<double>(s.strategy->optimizer_state_bytes()) / (1024.0 * 1024.0);
  logger.log_event(absl::StrFormat("parallel: %d rank(s), dp %lld, tp %lld%s, pp %lld, zero %lld, comm %s; optimizer "
                                   "state %.1f MB on this rank",
                                   s.world_size, static_cast<long long>(config_.parallel.dp),
                                   static_cast<long long>(config_.parallel.tp), config_.parallel.sp ? " with sp" : "",
                                   static_cast<long long>(config_.parallel.pp),
                                   static_cast<long long>(config_.parallel.zero), config_.comm.mode, optimizer_mb));
  if (train.warmup_steps > train.steps) {
    logger.log_event(absl::StrFormat("warning: train.warmup_steps = %lld is more than train.steps = %lld; the warm-up "
                                     "is cut to %lld steps",
                                     static_cast<long long>(train.warmup_steps), static_cast<long long>(train.steps),
                                     static_cast<long long>(train.steps)));
  }
  TrainResult result;
  result.first_step = s.start_step + 1;
  result.description = s.strategy->description();
  result.cost_model = s.cost.model;
  if (!s.tensor_plan.empty()) {
    result.description.push_back(absl::StrFormat("tensor-parallel plan (%d layers): %s",
                                                  static_cast<int>(s.tensor_plan.size()),
                                                  absl::StrJoin(s.tensor_plan, ", ")));
  }
  result.description.insert(result.description.end(), s.choices.begin(), s.choices.end());
  std::optional<double> predicted_step_ms;
  if (s.cost.model != nullptr) {
    try {
      const StepPrediction prediction = predict_step(workload_of(config_), layout_of(config_), *s.cost.model,
                                                     ranks_per_host(s.cost.host_ids));
      predicted_step_ms = prediction.step_ms;
      result.description.push_back("cost model: " + describe_prediction(prediction));
    } catch (const Error& error) {
      result.description.push_back(std::string("cost model: no prediction for this run: ") + error.what());
    }
  }
  for (const std::string& line : s.cost.lines) logger.log_event(line);
  for (const std::string& line : result.description) logger.log_event(line);
  if (s.start_step > 0) {
    logger.log_event(absl::StrFormat("resumed from %s at step %lld", resolve_resume_path(config_),
                                     static_cast<long long>(s.start_step)));
  } else if (config_.checkpoint.resume == "latest") {
    logger.log_event(absl::StrFormat("no checkpoint in %s yet; starting at step 1", config_.checkpoint.dir));
  }

  auto evaluate = [&](int64_t step) {
    if (!s.validation_data) return;
    s.strategy->complete_parameter_updates();
    autograd::NoGradGuard no_grad;
    model_->eval();
    s.validation_data->seek(s.validation_start);  // the same batches every time, so losses compare
    double total = 0;
    for (int64_t b = 0; b < config_.data.val_batches; ++b) {
      TokenBatch batch = s.validation_data->next_batch(micro_batch, steps_per_sequence);
      total += s.strategy->evaluation_loss(batch.inputs, batch.targets);
    }
    model_->train();
    const double mean = total / static_cast<double>(config_.data.val_batches);
    result.last_validation_loss = s.strategy->average(mean);
    logger.log_validation(step, *result.last_validation_loss);
  };
  // Rank 0's writes: in line, or on a background thread with checkpoint.async (checkpoint_writer.h),
  // which writes from host copies kept across saves (declared first: it outlives the writer's last write).
  CheckpointStaging staging;
  CheckpointWriter writer(config_.checkpoint.async);
  auto log_saved = [&](const std::optional<std::string>& line) {
    if (line && !line->empty()) logger.log_event(*line);
  };
  auto save = [&](int64_t step) {
    // How long training stands still for the save (in line: the whole write; checkpoint.async: the
    // wait for the write before, the gathers and the host copies), logged on rank 0 below.
    const auto save_started = std::chrono::steady_clock::now();
    double previous_write_ms = 0.0;
    if (leader && writer.asynchronous()) {
      // submit() would wait for the write in flight too; waiting here first tells that time apart.
      log_saved(writer.wait());
      previous_write_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - save_started).count();
    }
    // Every rank takes part in gathering sharded optimizer state; rank 0 writes.
    s.strategy->complete_parameter_updates();
    const std::map<std::string, Tensor> model_state = s.strategy->model_state();  // full tensors
    const std::map<std::string, Tensor> optimizer_state = s.strategy->optimizer_state();
    const std::map<std::string, uint64_t> random_state = s.strategy->random_state(model_->random_state());
    if (leader) {
      std::map<std::string, Tensor> tensors = with_prefix(model_state, kModelPrefix);
      for (auto& [name, tensor] : with_prefix(optimizer_state, kOptimizerPrefix)) tensors[name] = tensor;
      if (writer.asynchronous()) {
        // The write outlives this step: it gets its own host copies (training changes the live ones),
        // into the staging buffers the previous write (waited for above) has finished with.
        tensors = staging.copies(tensors);
      }
      nlohmann::json state = {{"train_data", s.train_data->position()},
                              {"random_state", random_state},
                              {"parallel_dp", config_.parallel.dp},
                              {"parallel_zero", config_.parallel.zero},
                              {"parallel_tp", config_.parallel.tp},
                              {"parallel_pp", config_.parallel.pp},
                              {"config", dump_config(config_)}};
      // The figures this run chose by, so that a resumed run chooses the same (prepare_cost_model).
      if (s.cost.model != nullptr) state["cost_model"] = calibration_json(*s.cost.model);
      log_saved(writer.submit([tensors = std::move(tensors), state = std::move(state), step,
                               checkpoint = config_.checkpoint, fault = s.fault, rank = s.world_rank]() -> std::string {
        try {
          save_checkpoint(checkpoint.dir, step, tensors, state, [&](CheckpointPhase phase) {
            if (fault) fault->at(rank, step, checkpoint_fault_phase(phase));
          });
          prune_checkpoints(checkpoint.dir, checkpoint.keep);
          return absl::StrFormat("step %lld  checkpoint saved to %s/%s", static_cast<long long>(step), checkpoint.dir,
                                 checkpoint_folder_name(step));
        } catch (const Error& error) {
          // The failed save left `latest` and the earlier steps as they were (checkpoint.h).
          const std::string kept = latest_checkpoint(checkpoint.dir);
          if (checkpoint.on_save_error == "stop") {
            WEFT_FAIL(error.what(), "; the last complete checkpoint is ", kept.empty() ? std::string("none") : kept,
                      " (checkpoint.on_save_error: continue would train on)");
          }
          return absl::StrFormat("step %lld  checkpoint not saved: %s; training goes on "
                                 "(checkpoint.on_save_error: continue), the last complete checkpoint is %s",
                                 static_cast<long long>(step), error.what(), kept.empty() ? "none" : kept);
        }
      }));
    }
    // In line, the other ranks wait here, without the collectives' deadline, however long the write
    // takes; a background write keeps nobody waiting.
    if (!writer.asynchronous()) s.strategy->wait_for_all_ranks();
    const double held_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - save_started).count();
    logger.log_event(
        writer.asynchronous()
            ? absl::StrFormat("step %lld  checkpoint save held training for %.1f ms (checkpoint.async: %.1f ms "
                              "waiting for the previous write, then the host copies into %.0f MB of staging, "
                              "%.0f MB of it pinned; written in the background)",
                              static_cast<long long>(step), held_ms, previous_write_ms, staging.bytes() / 1e6,
                              staging.pinned_bytes() / 1e6)
            : absl::StrFormat("step %lld  checkpoint save held training for %.1f ms (in line: written before "
                              "training goes on)",
                              static_cast<long long>(step), held_ms));
  };

  // Saves are tracked so that a stop or a timed save never writes the step a scheduled save wrote.
  int64_t saved_step = s.start_step;
  auto last_save_time = std::chrono::steady_clock::now();
  auto save_once = [&](int64_t step) {
    if (step == saved_step) return;
    save(step);
    saved_step = step;
    last_save_time = std::chrono::steady_clock::now();
  };

  // Steps issued and not yet reported, oldest first. With train.steps_in_flight 2 the host issues
  // step k + 1 before it reads step k's loss, so step k's log line, evaluation and saves come after
  // k + 1 was issued; a step after which the run evaluates, saves or ends is reported before anything
  // else is issued, so those see exactly its weights.
  struct IssuedStep {
    int64_t step = 0;
    double lr = 0.0;
    double issued_ms = 0.0;  // clock_ms() when its issue began
  };
  std::deque<IssuedStep> in_flight;
  double last_end_ms = 0.0;  // StepReport::end_clock_ms of the last step reported
  const double run_started_ms = clock_ms();
  auto scheduled_val = [&](int64_t step) { return config_.data.val_every > 0 && step % config_.data.val_every == 0; };
  auto scheduled_save = [&](int64_t step) {
    return !config_.checkpoint.dir.empty() && config_.checkpoint.every > 0 && step % config_.checkpoint.every == 0;
  };
  // Reports the oldest step in flight: its log line, and its scheduled evaluation and save.
  auto report_oldest = [&] {
    const IssuedStep issued = in_flight.front();
    in_flight.pop_front();
    const StepReport report = s.strategy->finish_step();  // waits for this step only
    // A step's time runs from its issue, or from the last step's end where it was issued before that
    // ended: with steps in flight, the time from one step's end to the next's is what a step costs.
    // Not from one report to the next: on the CPU a step runs inside its issue, before the last
    // step's report.
    const double seconds = (report.end_clock_ms - std::max(issued.issued_ms, last_end_ms)) / 1000.0;
    last_end_ms = report.end_clock_ms;
    StepMetrics metrics;
    metrics.step = issued.step;
    metrics.lr = issued.lr;
    metrics.loss = report.loss;
    metrics.grad_norm = report.grad_norm;
    metrics.skipped = report.skipped;
    metrics.compute_ms = report.compute_ms;
    metrics.predicted_step_ms = predicted_step_ms;
    metrics.comm_ms = report.comm_ms;
    metrics.exposed_comm_ms = report.exposed_comm_ms;
    if (config_.parallel.pp > 1) {
      metrics.pipeline_bubble = report.pipeline_bubble;
      metrics.pipeline_bubble_theory = report.pipeline_bubble_theory;
    }
    metrics.optimizer_state_mb = optimizer_mb;
    metrics.step_ms = 1000.0 * seconds;
    metrics.elapsed_s = (report.end_clock_ms - run_started_ms) / 1000.0;
    metrics.tokens_per_s = tokens_per_step / seconds;
    // Against the peak of every GPU of the run (one per rank).
    if (s.device.is_cuda()) metrics.mfu = step_flops / seconds / (kGpuPeakFlops * s.world_size);
    metrics.memory_mb = memory_megabytes(s.device);
    if (config_.parallel.pp > 1) metrics.stage_memory_mb = s.strategy->per_stage(metrics.memory_mb);
    logger.log_step(metrics);
    result.losses.push_back(metrics.loss);
    result.steps.push_back(metrics);
    result.last_step = issued.step;

    if (leader) log_saved(writer.poll());  // a background save that finished during the step
    if (scheduled_val(issued.step)) evaluate(issued.step);
    if (scheduled_save(issued.step)) save_once(issued.step);
  };
  // The step boundary's vote, after a step's report. Every rank votes at every reported step, so
  // none stops or saves alone. A save or stop agreed with a step still in flight waits for its report.
  auto vote = [&] {
    const double minutes_since_save =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time).count() / 60.0;
    const bool save_due = config_.checkpoint.every_minutes > 0 && minutes_since_save >= config_.checkpoint.every_minutes;
    const StepAgreement agreement = agree_at_step_boundary(stop_requested(), save_due, leader, s.world_size);
    if (!agreement.save && !agreement.stop) return false;
    while (!in_flight.empty()) report_oldest();
    if (!config_.checkpoint.dir.empty()) save_once(result.last_step);
    return agreement.stop;
  };

  model_->train();
  for (int64_t step = s.start_step + 1; step <= train.steps && !result.stopped_by_signal; ++step) {
    const double lr = s.schedule->at(step - 1);
    const double issued_ms = clock_ms();
    // The step's graph (built once, by the strategy) runs every micro-batch, collective and the
    // update, and times every node: the compute / communication / exposed-communication split.
    s.strategy->issue_step(step, lr, [&] {
      TokenBatch batch = s.train_data->next_batch(micro_batch, steps_per_sequence);
      return MicroBatch{batch.inputs, batch.targets};  // on the host: the step counts and uploads them
    });
    in_flight.push_back({step, lr, issued_ms});
    if (step == s.start_step + 1 && !config_.log.graph_file.empty() && leader) {
      s.strategy->write_graph(config_.log.graph_file);
    }
    // Steps are reported in order, each followed by the boundary's vote, so that a signal during a
    // step, its evaluation or its save stops the run at that step (or at the one in flight after it).
    const bool report_now = step == train.steps || scheduled_val(step) || scheduled_save(step);
    while (!in_flight.empty() && (report_now || static_cast<int>(in_flight.size()) >= s.steps_in_flight)) {
      report_oldest();
      if (vote()) {
        result.stopped_by_signal = true;
        break;
      }
    }
  }
  if (!result.stopped_by_signal && config_.data.val_every > 0 && result.last_step % config_.data.val_every != 0 &&
      result.last_step > 0) {
    evaluate(result.last_step);
  }
  if (!config_.checkpoint.dir.empty() && result.last_step > 0) save_once(result.last_step);
  if (leader) log_saved(writer.wait());  // the last save is on the disk before the run reports its end
  if (result.stopped_by_signal) {
    // Rank 0 reports; the signal may have reached another rank only.
    const std::string signal = stop_signal_name().empty() ? "a signal to another rank" : stop_signal_name();
    logger.log_event(
        config_.checkpoint.dir.empty()
            ? absl::StrFormat("weft-train: stopped at step %lld of %lld on %s; checkpoint.dir is not set, so "
                              "nothing was saved to resume from",
                              static_cast<long long>(result.last_step), static_cast<long long>(train.steps), signal)
            : absl::StrFormat("weft-train: stopped at step %lld of %lld on %s; resume with the same command and "
                              "--set checkpoint.resume=latest",
                              static_cast<long long>(result.last_step), static_cast<long long>(train.steps), signal));
  }
  s.strategy->complete_parameter_updates();
  if (!config_.log.trace_file.empty()) s.strategy->write_trace(config_.log.trace_file);  // every rank's rows
  return result;
}

}  // namespace weft
