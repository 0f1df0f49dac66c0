// prepare_cost_model and the run's layout for the simulator (cost_model_setup.h).
#include "launcher/cost_model_setup.h"

#include <filesystem>

#include "absl/strings/str_format.h"
#include "launcher/calibration_file.h"
#include "launcher/compute_anchor.h"
#include "layers/mlp.h"
#include "parallel/cost/calibration.h"
#include "parallel/cost/collective_matmul_choice.h"
#include "parallel/cost/host_topology.h"

namespace weft {

namespace {

// Why the figures saved in a resumed checkpoint do not fit this run ("" when they do): they were
// measured on another kind of device or dtype, or for another layout, whose shapes and groups they
// describe. Such a run cannot continue bit for bit anyway, and a measurement describes it better.
std::string why_not_resumed_figures(const nlohmann::json& state, const RunConfig& config, Device device, DType dtype) {
  const nlohmann::json& figures = state.at("cost_model");
  if (!figures.is_object()) return "";  // calibration_from_json names the damage
  const std::string device_kind = device.is_cpu() ? "cpu" : "cuda";
  const std::string saved_device = figures.value("device", std::string());
  const std::string saved_dtype = figures.value("dtype", std::string());
  if (saved_device != device_kind || saved_dtype != dtype_name(dtype)) {
    return absl::StrFormat("measured on %s in %s, this run is on %s in %s", saved_device, saved_dtype, device_kind,
                           dtype_name(dtype));
  }
  const ParallelConfig& parallel = config.parallel;
  const int64_t dp = state.value("parallel_dp", int64_t{0}), tp = state.value("parallel_tp", int64_t{0}),
                pp = state.value("parallel_pp", int64_t{0});
  if (dp != parallel.dp || tp != parallel.tp || pp != parallel.pp) {
    return absl::StrFormat("saved at dp %d tp %d pp %d, this run is at dp %d tp %d pp %d", dp, tp, pp, parallel.dp,
                           parallel.tp, parallel.pp);
  }
  return "";
}

}  // namespace

CostModelSetup prepare_cost_model(const RunConfig& config, Device device, DType dtype, int world_rank,
                                  const nlohmann::json* resumed_state) {
  CostModelSetup setup;
  setup.host_ids = world_host_ids();
  const CommConfig& comm = config.comm;
  const std::string& file = comm.calibration_file;
  if (!file.empty() && comm.calibrate != "on" && std::filesystem::exists(file)) {
    CostModel model = read_calibration_file(file, default_cost_model(device));
    setup.lines.push_back(absl::StrFormat("cost model: figures from %s (%s)", file, model.source));
    for (const std::string& line : model.describe()) setup.lines.push_back("  " + line);
    setup.model = std::make_shared<const CostModel>(std::move(model));
    return setup;
  }
  const bool measure = comm.calibrate == "on" || (comm.calibrate == "auto" && comm.mode == "auto");
  if (!measure) return setup;
  const bool saved = resumed_state != nullptr && resumed_state->contains("cost_model");
  const std::string unfit = saved ? why_not_resumed_figures(*resumed_state, config, device, dtype) : "";
  if (comm.calibrate == "auto" && saved && unfit.empty()) {
    CostModel model = calibration_from_json(resumed_state->at("cost_model"), default_cost_model(device),
                                            "the resumed checkpoint's cost_model (state.json)", "a resumed checkpoint");
    setup.lines.push_back(absl::StrFormat("cost model: the figures of the run being resumed (%s), not measured again, "
                                          "so that this run chooses as it did (comm.calibrate: on measures anew)",
                                          model.source));
    for (const std::string& line : model.describe()) setup.lines.push_back("  " + line);
    if (!file.empty() && world_rank == 0) {  // a file that existed was read above
      write_calibration_file(file, model);
      setup.lines.push_back("cost model: written to " + file);
    }
    setup.model = std::make_shared<const CostModel>(std::move(model));
    return setup;
  }
  if (comm.calibrate == "auto" && saved) {
    setup.lines.push_back("cost model: the resumed checkpoint's figures are not used (" + unfit + "): measured anew");
  }
  CalibrationResult result = calibrate(device, dtype, calibration_shapes(config, config.parallel.tp), setup.host_ids);
  const std::string anchor = anchor_compute(config, device, dtype, setup.host_ids, result.model);
  setup.lines.push_back("cost model: " + result.model.source);
  for (const std::string& line : result.model.describe()) setup.lines.push_back("  " + line);
  if (!anchor.empty()) setup.lines.push_back(anchor);
  if (!file.empty() && world_rank == 0) {
    write_calibration_file(file, result.model);
    setup.lines.push_back("cost model: written to " + file);
  }
  setup.model = std::make_shared<const CostModel>(result.model);
  return setup;
}

int64_t micro_batch_tokens(const RunConfig& config) {
  return config.train.batch_size / config.parallel.dp / config.train.micro_batches * config.model.seq_len;
}

CalibrationShapes calibration_shapes(const RunConfig& config, int64_t tp) {
  CalibrationShapes shapes;
  shapes.batch = std::max<int64_t>(micro_batch_tokens(config) / config.model.seq_len, 1);
  shapes.seq_len = config.model.seq_len;
  shapes.dim = config.model.dim;
  shapes.hidden = std::max<int64_t>(mlp_hidden_width(config.model) / tp, 1);
  shapes.heads = std::max<int64_t>(config.model.heads / tp, 1);
  shapes.head_dim = config.model.dim / config.model.heads;
  shapes.vocab = std::max<int64_t>(config.model.vocab / tp, 1);
  return shapes;
}

std::string choose_ring_chunks(const RunConfig& config, TensorParallelGroup& tp, const CostModelSetup& cost) {
  const std::string& mode = config.comm.collective_matmul;
  if (mode == "ring" || mode == "single") {
    tp.ring_chunks = mode == "ring" ? tp.size() : 1;
    return "collective matmuls: " + std::string(mode == "ring" ? "ring" : "one collective") + " (comm.collective_matmul)";
  }
  tp.ring_chunks = tp.size();
  if (cost.model == nullptr) return "collective matmuls: ring (no cost model to choose by: comm.calibrate)";
  // The q/k/v linear of a block: the whole micro-batch's activation gathered, this rank's third of
  // the heads multiplied (the other linears differ in width, not in kind).
  const double tokens = static_cast<double>(micro_batch_tokens(config));
  const double dim = static_cast<double>(config.model.dim);
  const double bytes = tokens * dim * (config.train.dtype == "bf16" ? 2.0 : 4.0);
  const double flops = 2.0 * tokens * dim * 3.0 * dim / tp.size();
  const LinkClass link = cost.host_ids.empty() ? LinkClass::kSameHost
                                               : link_class_of(hosts_of(tp.group->world_ranks(), cost.host_ids));
  const CollectiveMatmulChoice choice = choose_collective_matmul_chunks(bytes, flops, tp.size(), link, *cost.model);
  tp.ring_chunks = choice.chunks;
  return "cost model: " + choice.explanation;
}

ParallelLayout layout_of(const RunConfig& config) {
  ParallelLayout layout;
  layout.dp = static_cast<int>(config.parallel.dp);
  layout.tp = static_cast<int>(config.parallel.tp);
  layout.pp = static_cast<int>(config.parallel.pp);
  layout.zero = static_cast<int>(config.parallel.zero);
  layout.micro_batches = static_cast<int>(config.train.micro_batches);
  layout.schedule = config.parallel.pp_schedule;
  layout.virtual_stages = static_cast<int>(config.parallel.pp_virtual);
  layout.pp_transport = config.parallel.pp_transport;
  layout.sequence_parallel = config.parallel.sp;
  layout.comm_mode = config.comm.mode;
  layout.bucket_bytes = static_cast<int64_t>(config.comm.bucket_mb * 1024.0 * 1024.0);
  layout.dp_all_reduce = config.comm.dp_all_reduce;
  return layout;
}

Workload workload_of(const RunConfig& config) {
  Workload workload;
  workload.model = config.model;
  workload.batch_size = config.train.batch_size;
  workload.dtype = config.train.dtype;
  workload.optimizer = config.train.optimizer;
  return workload;
}

std::string describe_prediction(const StepPrediction& p) {
  std::string text = absl::StrFormat("predicted step %.2f ms: compute %.2f, communication %.2f (exposed %.2f), "
                                     "optimizer %.2f",
                                     p.step_ms, p.compute_ms, p.comm_ms, p.exposed_comm_ms, p.optimizer_ms);
  if (p.bubble > 0) text += absl::StrFormat(", bubble %.0f%%", 100.0 * p.bubble);
  text += absl::StrFormat("; %.0f tokens/s; %.0f MB per rank (weights and optimizer %.0f, activations %.0f)",
                          p.tokens_per_s, p.memory_bytes / 1048576.0, p.weights_bytes / 1048576.0,
                          p.activation_bytes / 1048576.0);
  if (p.bucket_bytes > 0) text += absl::StrFormat("; buckets of %.2f MB", p.bucket_bytes / 1048576.0);
  if (p.dp_hierarchical) text += "; hierarchical dp all-reduce";
  return text;
}

}  // namespace weft
