#include "launcher/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>

#include "absl/strings/str_format.h"
#include "launcher/checkpoint.h"
#include "launcher/config_loader.h"
#include "launcher/dataset.h"
#include "launcher/metrics_logger.h"
#include "launcher/text_dataset.h"
#include "launcher/token_shard_dataset.h"
#include "optim/gradient_clipping.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
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

}  // namespace

struct Trainer::State {
  Device device;
  DType compute_dtype = kFloat32;
  std::unique_ptr<Dataset> train_data;
  std::unique_ptr<Dataset> validation_data;
  DatasetPosition validation_start;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<LearningRateSchedule> schedule;
  int64_t start_step = 0;  // steps already done (from a checkpoint)
};

std::string resolve_resume_path(const RunConfig& config) {
  const std::string& resume = config.checkpoint.resume;
  if (resume.empty()) return "";
  if (resume == "latest") return latest_checkpoint(config.checkpoint.dir);
  return resume;
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)), state_(std::make_unique<State>()) {
  validate_config(config_);
  State& s = *state_;
  s.device = Device::parse(config_.train.device);
  s.compute_dtype = parse_dtype(config_.train.dtype);
  const ModelConfig& model_config = config_.model;

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
  if (s.validation_data) s.validation_start = s.validation_data->position();

  model_ = build_model(model_config);
  if (s.compute_dtype != kFloat32) model_->to(s.compute_dtype);
  if (!s.device.is_cpu()) model_->to(s.device);

  std::vector<ParameterGroup> groups = default_parameter_groups(model_->named_parameters(), config_.train.weight_decay);
  if (config_.train.optimizer == "adamw") {
    s.optimizer = make_adamw(std::move(groups), {config_.train.beta1, config_.train.beta2, config_.train.eps});
  } else {
    s.optimizer = make_sgd(std::move(groups), {config_.train.momentum, false});
  }
  s.schedule = std::make_unique<LearningRateSchedule>(config_.train.lr, config_.train.warmup_steps,
                                                      config_.train.steps, config_.train.schedule,
                                                      config_.train.min_lr_ratio);

  const std::string resume_path = resolve_resume_path(config_);
  if (!resume_path.empty()) {
    LoadedCheckpoint checkpoint = load_checkpoint(resume_path);
    model_->load_state_dict(strip_prefix(checkpoint.tensors, kModelPrefix));
    s.optimizer->load_state_dict(strip_prefix(checkpoint.tensors, kOptimizerPrefix));
    s.train_data->seek(checkpoint.state.at("train_data").get<DatasetPosition>());
    model_->load_random_state(checkpoint.state.at("random_state").get<std::map<std::string, uint64_t>>());
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
  const int64_t vocabulary = config_.model.vocab;
  const double tokens_per_step = static_cast<double>(train.batch_size * steps_per_sequence);
  const double step_flops = tokens_per_step * flops_per_token(config_.model, model_->parameter_count());
  const std::vector<Tensor> parameters = model_->parameters();

  MetricsLogger logger(train.steps, config_.log.every, config_.log.metrics_file, config_.log.progress);
  logger.log_event(absl::StrFormat("weft-train: %s model, %lld parameters, %s on %s, %s; %lld steps of %lld x %lld "
                                   "tokens",
                                   config_.model.type, static_cast<long long>(model_->parameter_count()),
                                   dtype_name(s.compute_dtype), s.device.to_string(), s.train_data->describe(),
                                   static_cast<long long>(train.steps), static_cast<long long>(train.batch_size),
                                   static_cast<long long>(steps_per_sequence)));
  if (s.start_step > 0) {
    logger.log_event(absl::StrFormat("resumed from %s at step %lld", resolve_resume_path(config_),
                                     static_cast<long long>(s.start_step)));
  }

  TrainResult result;
  result.first_step = s.start_step + 1;
  auto evaluate = [&](int64_t step) {
    if (!s.validation_data) return;
    autograd::NoGradGuard no_grad;
    model_->eval();
    s.validation_data->seek(s.validation_start);  // the same batches every time, so losses compare
    double total = 0;
    for (int64_t b = 0; b < config_.data.val_batches; ++b) {
      TokenBatch batch = s.validation_data->next_batch(micro_batch, steps_per_sequence);
      Tensor logits = model_->logits(batch.inputs.to(s.device));
      total += cross_entropy(logits.reshape({-1, vocabulary}), batch.targets.to(s.device).reshape({-1})).item();
    }
    model_->train();
    result.last_validation_loss = total / static_cast<double>(config_.data.val_batches);
    logger.log_validation(step, *result.last_validation_loss);
  };
  auto save = [&](int64_t step) {
    std::map<std::string, Tensor> tensors = with_prefix(model_->state_dict(), kModelPrefix);
    for (auto& [name, tensor] : with_prefix(s.optimizer->state_dict(), kOptimizerPrefix)) tensors[name] = tensor;
    nlohmann::json state = {{"train_data", s.train_data->position()},
                            {"random_state", model_->random_state()},
                            {"config", dump_config(config_)}};
    save_checkpoint(config_.checkpoint.dir, step, tensors, state);
    logger.log_event(absl::StrFormat("step %lld  checkpoint saved to %s/%s", static_cast<long long>(step),
                                     config_.checkpoint.dir, checkpoint_folder_name(step)));
  };

  model_->train();
  for (int64_t step = s.start_step + 1; step <= train.steps; ++step) {
    const auto started = std::chrono::steady_clock::now();
    const double lr = s.schedule->at(step - 1);
    double loss_total = 0;
    for (int64_t micro = 0; micro < train.micro_batches; ++micro) {
      TokenBatch batch = s.train_data->next_batch(micro_batch, steps_per_sequence);
      Tensor logits = model_->logits(batch.inputs.to(s.device));  // [B, T, V]
      Tensor loss = cross_entropy(logits.reshape({-1, vocabulary}), batch.targets.to(s.device).reshape({-1}));
      // Each micro-batch's mean loss is divided by their count, so the accumulated gradient is the
      // gradient of the mean over the whole step's batch.
      if (train.micro_batches > 1) loss = scale(loss, 1.0 / static_cast<double>(train.micro_batches));
      loss.backward();
      loss_total += loss.item();
    }
    StepMetrics metrics;
    metrics.step = step;
    metrics.loss = loss_total;  // the sum of pre-divided micro-batch means: the step's mean loss
    metrics.lr = lr;
    if (!std::isfinite(metrics.loss)) {
      WEFT_CHECK(train.on_nan == "skip", "the training loss is ", metrics.loss, " at step ", step,
                 " (train.on_nan: stop); lower train.lr, raise train.warmup_steps, or set train.on_nan: skip");
      s.optimizer->zero_grad();
      metrics.skipped = true;
    } else {
      metrics.grad_norm = clip_grad_norm(parameters, train.grad_clip);
      s.optimizer->step(lr);
      s.optimizer->zero_grad();
    }
    backend_for(s.device).synchronize(s.device);  // step times measure the work, not its launch
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    metrics.step_ms = 1000.0 * seconds;
    metrics.tokens_per_s = tokens_per_step / seconds;
    if (s.device.is_cuda()) metrics.mfu = step_flops / seconds / kGpuPeakFlops;
    metrics.memory_mb = memory_megabytes(s.device);
    logger.log_step(metrics);
    result.losses.push_back(metrics.loss);
    result.last_step = step;

    if (config_.data.val_every > 0 && step % config_.data.val_every == 0) evaluate(step);
    if (!config_.checkpoint.dir.empty() && config_.checkpoint.every > 0 && step % config_.checkpoint.every == 0) {
      save(step);
    }
  }
  if (config_.data.val_every > 0 && result.last_step % config_.data.val_every != 0 && result.last_step > 0) {
    evaluate(result.last_step);
  }
  if (!config_.checkpoint.dir.empty() && result.last_step > 0 &&
      (config_.checkpoint.every == 0 || result.last_step % config_.checkpoint.every != 0)) {
    save(result.last_step);
  }
  return result;
}

}  // namespace weft
