// The compute anchor (compute_anchor.h).
#include "launcher/compute_anchor.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "launcher/cost_model_setup.h"
#include "layers/language_model.h"
#include "parallel/comm/process_group.h"
#include "parallel/cost/calibration.h"
#include "parallel/cost/host_topology.h"
#include "parallel/cost/step_simulator.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace weft {
namespace {

// At least this long (sustained_mean_ms: three runs after a warm-up at least), as for the rates.
constexpr double kSustainedMs = 50.0;

double physical_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

// Mean ms of one forward and backward of `config`'s model on `sequences` sequences.
double time_micro_batch(const RunConfig& config, Device device, DType dtype, int64_t sequences) {
  ModelConfig model_config = config.model;
  model_config.recompute = config.train.recompute;  // the run's activation recomputation, as the trainer builds it
  std::shared_ptr<LanguageModel> model = build_model(model_config);
  if (dtype != kFloat32) model->to(dtype);
  if (!device.is_cpu()) model->to(device);
  const int64_t tokens = sequences * config.model.seq_len;
  std::vector<int64_t> ids(static_cast<size_t>(tokens)), targets(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) {
    ids[static_cast<size_t>(i)] = (i * 7919) % config.model.vocab;
    targets[static_cast<size_t>(i)] = (i * 104729 + 1) % config.model.vocab;
  }
  const Tensor input = Tensor::from_vector(absl::MakeConstSpan(ids), {sequences, config.model.seq_len}, kInt64, device);
  const Tensor target =
      Tensor::from_vector(absl::MakeConstSpan(targets), {sequences, config.model.seq_len}, kInt64, device);
  Backend& backend = backend_for(device);
  return sustained_mean_ms(
      [&] {
        loss(*model, input, target).backward();
        backend.synchronize(device);
      },
      kSustainedMs);
}

}  // namespace

std::string anchor_compute(const RunConfig& config, Device device, DType dtype, const std::vector<int>& host_ids,
                           CostModel& model) {
  WEFT_CHECK(model.compute.scale == 1.0, "anchor_compute: the cost model is already anchored");
  if (!device.is_cpu()) return "";  // see compute_anchor.h: the GPU's rates need no anchor
  const int64_t sequences = std::max<int64_t>(micro_batch_tokens(config) / config.model.seq_len, 1);
  Workload workload = workload_of(config);
  workload.batch_size = sequences;
  ParallelLayout one_rank;
  one_rank.comm_mode = config.comm.mode;
  const StepPrediction predicted = predict_step(workload, one_rank, model, 1);
  const double modelled_ms = predicted.compute_ms - predicted.optimizer_ms;  // forward and backward
  if (predicted.memory_bytes > physical_memory_bytes() / 4) {
    return absl::StrFormat("cost model: no compute anchor (one micro-batch of the model needs about %.0f MB, over a "
                           "quarter of this host's memory)", predicted.memory_bytes / 1e6);
  }
  std::shared_ptr<ProcessGroup> world = make_world_process_group(device);
  const int me = world->rank();
  const bool first_of_host = first_rank_of_host(host_ids, me);
  // Each host's first rank times while the others wait in a barrier, which yields their cores.
  double measured_ms = 0.0;
  world->barrier(CommStream())->synchronize();
  if (first_of_host) measured_ms = time_micro_batch(config, device, dtype, sequences);
  world->barrier(CommStream())->synchronize();
  Tensor slowest = Tensor::from_vector(std::vector<double>{measured_ms}, {1}, kFloat64);
  world->all_reduce(slowest, Reduction::kMax, CommStream())->synchronize();
  measured_ms = slowest.item();
  model.compute.scale = std::max(measured_ms / std::max(modelled_ms, 1e-6), 1e-3);
  return absl::StrFormat("cost model: one micro-batch of the model (%lld sequences), forward and backward on one rank: "
                         "%.2f ms measured, %.2f ms from the rates; compute durations scaled by %.2f",
                         static_cast<long long>(sequences), measured_ms, modelled_ms, model.compute.scale);
}

}  // namespace weft
