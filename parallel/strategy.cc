// make_strategy and build_parallel_model (strategy.h).
#include "parallel/strategy.h"

#include <algorithm>

#include "layers/mlp.h"
#include "absl/strings/str_format.h"
#include "parallel/comm/hierarchical_all_reduce.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/world_exchange.h"
#include "parallel/cost/bucket_choice.h"
#include "parallel/cost/host_topology.h"
#include "parallel/data/data_parallel_strategy.h"
#include "parallel/manual/tensor_parallel_gpt.h"
#include "parallel/tensor/tensor_parallel_plan.h"
#include "runtime/error.h"

#if WEFT_HAVE_CUDA
#include "runtime/cuda/stream.h"
#endif

namespace weft {
namespace {

// "1, 2 or 4": the tp sizes up to the world that divide every one of `sizes`.
std::string fitting_sizes(const std::vector<int64_t>& sizes, int limit) {
  std::vector<int> fits;
  for (int tp = 1; tp <= limit; ++tp) {
    if (std::all_of(sizes.begin(), sizes.end(), [tp](int64_t size) { return size % tp == 0; })) fits.push_back(tp);
  }
  std::string out;
  for (size_t i = 0; i < fits.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == fits.size() ? " or " : ", ") + std::to_string(fits[i]);
  }
  return out;
}

// The sizes tensor parallelism splits, each checked against tp with a message naming its key.
void check_tensor_parallel_config(const ModelConfig& config, int tp, bool sequence_parallel, int world_size) {
  const std::vector<std::pair<std::string, int64_t>> splits = tensor_parallel_splits(config, sequence_parallel);
  std::vector<int64_t> sizes;
  for (const auto& [key, size] : splits) sizes.push_back(size);
  for (const auto& [key, size] : splits) {
    // The sequence is split only under sequence parallelism, which the user can also turn off.
    const bool sequence = key.rfind("model.seq_len", 0) == 0;
    WEFT_CHECK(size % tp == 0, "parallel.tp = ", tp, " does not divide ", key, " = ", size,
               "; tensor parallelism splits it evenly: use parallel.tp ", fitting_sizes(sizes, world_size),
               key == "model.vocab" ? " (or pad model.vocab to a multiple of parallel.tp)"
               : sequence           ? str(" (or make model.seq_len a multiple of ", tp, ", or set parallel.sp: false)")
                                    : "");
  }
}

// Sets options.hierarchical_all_reduce when the dp gradients are reduced in two levels
// (options.dp_all_reduce; the auto choice compares the cost model's predictions for the stage's
// gradients) and says why in options.notes. The subgroups are made by every world rank alike
// (the conditions are the config's and the world's), then each dp group decides for itself.
void choose_dp_all_reduce(const Mesh& mesh, int world_rank, const ProcessGroup& data_group,
                          const std::vector<NamedParameter>& trained, StrategyOptions& options) {
  const std::string& mode = options.dp_all_reduce;
  const bool spans_hosts = !options.host_ids.empty() && link_class_of(options.host_ids) == LinkClass::kAcrossHosts;
  WEFT_CHECK(mode != "hierarchical" || options.zero_stage == 0, "comm.dp_all_reduce: hierarchical reduces whole "
             "gradients; with parallel.zero ", options.zero_stage, " they are reduce-scattered: set parallel.zero: 0 or "
             "comm.dp_all_reduce: flat");
  if (!spans_hosts || mesh.dp() == 1 || mode == "flat" || options.zero_stage > 0) {
    WEFT_CHECK(mode != "hierarchical", "comm.dp_all_reduce: hierarchical needs a dp group spanning hosts with two or "
               "more of its ranks on each, but ", spans_hosts ? "parallel.dp is 1" : "every rank is on one host",
               " (WEFT_RANKS_PER_HOST=K makes K consecutive ranks a host, for tests); use comm.dp_all_reduce: flat or auto");
    return;
  }
  if (mode == "auto" && options.comm_mode == "manual") {
    // Hand-written code fixes its path in advance; choosing it by the cost model is the auto mode's
    // (weft-compare's manual run has the model too, and must show the hand-written path).
    options.notes.push_back("dp all-reduce: flat (comm.mode manual fixes the path in advance; "
                            "comm.dp_all_reduce: hierarchical takes the two levels)");
    return;
  }
  std::shared_ptr<HierarchicalAllReduce> two_level =
      HierarchicalAllReduce::make(data_group, mesh.group_index(Axis::kData, world_rank), options.host_ids);
  if (two_level == nullptr) {
    const std::string reason = HierarchicalAllReduce::unsuitable(data_group, options.host_ids);
    WEFT_CHECK(mode != "hierarchical", "comm.dp_all_reduce: hierarchical does not fit the dp group ",
               data_group.describe(), ": ", reason, "; use comm.dp_all_reduce: flat or auto");
    options.notes.push_back("dp all-reduce: flat (" + reason + ")");
    return;
  }
  if (mode == "hierarchical") {
    options.hierarchical_all_reduce = two_level;
    options.notes.push_back(str("dp all-reduce: hierarchical (comm.dp_all_reduce), ", two_level->local_size(),
                                " ranks per host on ", two_level->hosts(), " hosts"));
    return;
  }
  if (options.cost_model == nullptr) {
    options.notes.push_back("dp all-reduce: flat (no cost model to choose by: comm.calibrate)");
    return;
  }
  double bytes = 0.0;
  for (const NamedParameter& parameter : trained) {
    bytes += static_cast<double>(parameter.tensor.numel() * parameter.tensor.element_size());
  }
  const CostModel& model = *options.cost_model;
  const double flat = model.collective_ms(CollectiveKind::kAllReduce, bytes, data_group.size(), LinkClass::kAcrossHosts);
  const double hierarchical = model.hierarchical_all_reduce_ms(bytes, two_level->local_size(), two_level->hosts());
  const bool take = hierarchical < flat;
  if (take) options.hierarchical_all_reduce = two_level;
  options.notes.push_back(absl::StrFormat(
      "cost model: dp all-reduce %s: predicted %.2f ms for the %.1f MB of gradients in two levels (%d ranks per host, "
      "%d hosts) against %.2f ms flat over %d ranks",
      take ? "hierarchical" : "flat", hierarchical, bytes / 1048576.0, two_level->local_size(), two_level->hosts(), flat,
      data_group.size()));
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> tensor_parallel_splits(const ModelConfig& config, bool sequence_parallel) {
  std::vector<std::pair<std::string, int64_t>> splits = {
      {"model.heads", config.heads},
      {"model.kv_heads", config.kv_heads > 0 ? config.kv_heads : config.heads},
      {"model.vocab", config.vocab},
      {"the MLP width (model.hidden_dim)", mlp_hidden_width(config)}};
  if (sequence_parallel) splits.push_back({"model.seq_len (with parallel.sp: true)", config.seq_len});
  return splits;
}

int64_t default_bucket_bytes(Device device) { return device.is_cpu() ? (int64_t{1} << 20) : (int64_t{25} << 20); }

std::unique_ptr<Strategy> make_strategy(const Mesh& mesh, int world_rank, LanguageModel& model,
                                        const StrategyOptions& given) {
  StrategyOptions options = given;
  WEFT_CHECK(mesh.tp() == 1 || (options.tensor_parallel != nullptr && options.tensor_parallel->size() == mesh.tp()),
             "strategy: parallel.tp = ", mesh.tp(), " needs the model built by build_parallel_model");
  const std::vector<NamedParameter> parameters = model.named_parameters();
  WEFT_CHECK(!parameters.empty(), "strategy: the model has no parameters");
  const Device device = parameters[0].tensor.device();
  std::shared_ptr<PipelineStage> pipeline;
  if (mesh.pp() > 1) {
    pipeline = std::make_shared<PipelineStage>(mesh, world_rank, model.segments(), parameters, options.pipeline, device,
                                               options.micro_batches);
  }
  std::shared_ptr<ProcessGroup> data_group = make_process_group(mesh, Axis::kData, device);
  if (options.bucket_bytes == 0 && options.comm_mode == "auto" && options.cost_model != nullptr &&
      data_group->size() > 1 && options.micro_batch_tokens > 0) {
    // Every rank of the dp group holds the same segments and the same (agreed) cost model, so all
    // choose the same size.
    const std::vector<NamedParameter> trained = pipeline != nullptr ? pipeline->local_parameters(parameters) : parameters;
    const LinkClass link = options.host_ids.empty() ? LinkClass::kSameHost
                                                    : link_class_of(hosts_of(data_group->world_ranks(), options.host_ids));
    const CollectiveKind kind = options.zero_stage > 0 ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
    const BucketChoice choice = choose_bucket_bytes(
        // A pipeline stage's own segments: the others are emptied (no work, no gradients here).
        backward_segments(pipeline != nullptr ? pipeline->local_segments(model.segments()) : model.segments(), parameters,
                          trained, options.pipeline.seq_len, options.micro_batch_tokens, *options.cost_model),
        *options.cost_model, kind, data_group->size(), link);
    options.bucket_bytes = choice.bucket_bytes;
    if (pipeline == nullptr) {
      options.notes.push_back("cost model: " + choice.explanation);
    } else {
      // Each stage's dp group chooses for its own gradients, and only rank 0 logs: it says every
      // stage's choice. (Collective over the world: every rank takes this branch, as dp and pp are
      // the same on every rank.)
      const std::vector<std::string> choices = gather_text_to_rank_zero(choice.explanation);
      for (int stage = 0; stage < static_cast<int>(choices.size()) && stage < mesh.pp(); ++stage) {
        const std::string& text = choices[static_cast<size_t>(mesh.rank_of({0, stage, 0}))];
        options.notes.push_back(str("cost model, stage ", stage, ": ", text));
      }
    }
  }
  if (options.bucket_bytes == 0) options.bucket_bytes = default_bucket_bytes(device);
  choose_dp_all_reduce(mesh, world_rank, *data_group, pipeline != nullptr ? pipeline->local_parameters(parameters) : parameters,
                       options);
  return std::make_unique<DataParallelStrategy>(std::move(data_group), world_rank, model, options, std::move(pipeline));
}

ParallelModel build_parallel_model(const ModelConfig& config, const Mesh& mesh, Device device,
                                   const std::string& comm_mode, bool sequence_parallel,
                                   const std::map<std::string, std::string>& plan_overrides) {
  ParallelModel out;
  if (mesh.tp() == 1) {
    out.model = build_model(config);
    return out;
  }
  check_tensor_parallel_config(config, mesh.tp(), sequence_parallel, mesh.world_size());
  auto tp = std::make_shared<TensorParallelGroup>();
  tp->group = make_process_group(mesh, Axis::kTensor, device);
  // Its collectives run inside the segments that issue them: recorded, they join the timeline.
  tp->recorder = std::make_shared<CollectiveRecorder>();
  tp->group = std::make_shared<TracedProcessGroup>(tp->group, tp->recorder);
  // The tp collectives run on a stream of their own while compute waits (manual) or goes on (auto's
  // pipelined matmuls): a thread on the CPU, a CUDA stream on a GPU (where the compute stream would
  // otherwise carry them and nothing could overlap). Its communicator (NCCL makes one per stream)
  // is made now, from the main thread, in one order on every rank.
  if (device.is_cpu()) {
    tp->stream = CommStream::cpu("tp_comm");
    tp->group->barrier(CommStream())->synchronize();
  } else {
#if WEFT_HAVE_CUDA
    tp->cuda_stream = std::make_shared<cuda::Stream>(device.index);
    tp->stream = CommStream::cuda(tp->cuda_stream->get(), device.index);
#endif
  }
  tp->group->barrier(tp->stream)->synchronize();
  if (comm_mode == "manual") {
    WEFT_CHECK(plan_overrides.empty(), "parallel.tp_plan applies to comm.mode: auto; the manual mode's "
               "tensor-parallel layers are written by hand (parallel/manual/)");
    out.model = build_tensor_parallel_model(config, *tp, sequence_parallel);
  } else {
    out.model = build_model(config);
    for (const AppliedPlanEntry& entry : apply_tensor_parallel_plan(*out.model, *tp, sequence_parallel, plan_overrides)) {
      out.plan.push_back(str(entry.module, ": ", parallel_style_name(entry.style)));
    }
  }
  out.tensor_parallel = tp;
  return out;
}

}  // namespace weft
