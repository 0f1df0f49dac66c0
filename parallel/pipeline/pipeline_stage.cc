// PipelineStage (pipeline_stage.h).
#include "parallel/pipeline/pipeline_stage.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "parallel/pipeline/stage_partition.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"

namespace weft {
namespace {

using Channel = PipelineTransport::Channel;

// Control-channel tags: shared gradients (by their index), evaluation (by boundary), gathers.
constexpr int64_t kEvaluationTag = 4096;
constexpr int64_t kGatherTag = 8192;

Tensor text_tensor(const std::string& text) {
  std::vector<int64_t> codes(text.begin(), text.end());
  return Tensor::from_vector(absl::Span<const int64_t>(codes), {static_cast<int64_t>(codes.size())}, kInt64);
}

std::string tensor_text(const Tensor& tensor) {
  std::string text;
  const Tensor codes = tensor.contiguous();
  for (int64_t i = 0; i < codes.numel(); ++i) text.push_back(static_cast<char>(codes.data<int64_t>()[i]));
  return text;
}

}  // namespace

PipelineStage::PipelineStage(const Mesh& mesh, int world_rank, const std::vector<ModelSegment>& segments,
                             const std::vector<NamedParameter>& parameters, const PipelineOptions& options,
                             Device device, int64_t micro_batches)
    : schedule_(parse_pipeline_schedule(options.schedule)), micro_batches_(micro_batches) {
  const int pp = mesh.pp();
  const int chunks = static_cast<int>(options.chunks);
  const PipelineShape shape{pp, static_cast<int>(micro_batches), chunks};
  check_pipeline_shape(schedule_, shape);
  const int virtual_stages = pp * chunks;
  WEFT_CHECK(static_cast<int>(segments.size()) >= virtual_stages, "parallel.pp = ", pp,
             options.chunks > 1 ? str(" with parallel.pp_virtual = ", options.chunks) : std::string(), " needs ",
             virtual_stages, " model segments, but the model has ", segments.size(),
             " (embedding, one per block, head): use fewer stages or more layers");

  // The cut: by hand (parallel.pp_layers) or by cost.
  const std::vector<double> flops = segment_flops_per_token(segments, parameters, options.seq_len);
  const std::vector<int64_t> counts = segment_parameter_counts(segments, parameters);
  const StagePartition partition =
      partition_model(segments, parameters, options.seq_len, options.layers, virtual_stages);
  placement_.stage = mesh.coordinates(world_rank).pp;
  placement_.stages = pp;
  placement_.chunks = chunks;
  placement_.first_segment = partition.first_segment;

  // Which stages read each parameter.
  std::map<std::string, std::set<int>> readers;
  for (size_t s = 0; s < segments.size(); ++s) {
    const int stage = placement_.stage_of(placement_.virtual_stage_of_segment(static_cast<int>(s)));
    for (const std::string& name : segments[s].parameters) readers[name].insert(stage);
  }
  int64_t shared_index = 0;
  for (const auto& [name, stages] : readers) {
    if (stages.count(placement_.stage)) local_names_.insert(name);
    if (stages.size() < 2) continue;
    WEFT_CHECK(stages.size() == 2, "pipeline: parameter ", name, " is read by segments of ", stages.size(),
               " stages; a shared parameter (a tied embedding) may be shared by two stages only; cut the model "
               "differently (parallel.pp_layers)");
    const int64_t tag = shared_index++;
    if (!stages.count(placement_.stage)) continue;
    shared_peer_[name] = *stages.begin() == placement_.stage ? *stages.rbegin() : *stages.begin();
    shared_tag_[name] = tag;
  }
  for (const NamedParameter& parameter : parameters) {
    if (!readers.count(parameter.name)) unnamed_.insert(parameter.name);
  }

  WEFT_CHECK(options.transport == "host" || options.transport == "direct", "parallel.pp_transport '",
             options.transport, "': expected host or direct");
  const PipelineTransport::Route route =
      options.transport == "direct" ? PipelineTransport::Route::kDirect : PipelineTransport::Route::kHost;
  transport_ = std::make_shared<PipelineTransport>(mesh, world_rank, route, device);
  group_ = make_process_group(mesh, Axis::kPipeline, device);

  const std::vector<std::vector<PipelineAction>> actions = pipeline_actions(schedule_, shape);
  const PipelineSimulation simulation = simulate_pipeline(actions, shape);
  theoretical_bubble_ = weft::theoretical_bubble(schedule_, shape);
  in_flight_ = simulation.peak_in_flight[static_cast<size_t>(placement_.stage)];
  for (const std::string& line : describe_partition(partition, segments, flops, counts, pp)) {
    description_.push_back(line);
  }
  std::string in_flight;
  for (size_t s = 0; s < simulation.peak_in_flight.size(); ++s) {
    in_flight += str(s == 0 ? "" : ", ", simulation.peak_in_flight[s]);
  }
  description_.push_back(absl::StrFormat(
      "pipeline schedule %s: %d stages%s, %lld micro-batches; bubble %.1f%% in theory (equal forward, input- and "
      "weight-gradient times), %.1f%% simulated; activations in flight per stage (micro-batches): %s",
      pipeline_schedule_name(schedule_), pp, chunks > 1 ? str(" x ", chunks, " chunks") : std::string(),
      static_cast<long long>(micro_batches), 100.0 * theoretical_bubble_, 100.0 * simulation.bubble, in_flight));
  const bool direct = transport_->route() == PipelineTransport::Route::kDirect;
  // A direct route whose sends do not wait on the host is NCCL's.
  const std::string carrier = device.is_cpu() ? "MPI"
                              : direct && !transport_->sends_block_host() ? "NCCL, device to device"
                                                                          : "MPI, through host memory";
  description_.push_back(str("pipeline messages: parallel.pp_transport ", direct ? "direct" : "host", " (", carrier,
                             direct ? "; a group per direction, paired in order" : "; tagged", ")"));
}

std::vector<ModelSegment> PipelineStage::local_segments(std::vector<ModelSegment> segments) const {
  for (size_t s = 0; s < segments.size(); ++s) {
    if (placement_.holds(static_cast<int>(s))) continue;
    const std::string name = segments[s].name;
    segments[s].forward = [name](const Tensor&) -> Tensor {
      WEFT_FAIL("pipeline: segment '", name, "' runs on another stage");
    };
    segments[s].parameters.clear();
  }
  return segments;
}

std::vector<NamedParameter> PipelineStage::local_parameters(const std::vector<NamedParameter>& parameters) const {
  std::vector<NamedParameter> local;
  for (const NamedParameter& parameter : parameters) {
    if (local_names_.count(parameter.name) || (placement_.stage == 0 && unnamed_.count(parameter.name))) {
      local.push_back(parameter);
    }
  }
  return local;
}

bool PipelineStage::is_second_copy(const std::string& name) const {
  const auto found = shared_peer_.find(name);
  return found != shared_peer_.end() && found->second < placement_.stage;
}

void PipelineStage::sum_shared_gradient(const std::string& name, const Tensor& gradient) {
  const auto peer = shared_peer_.find(name);
  WEFT_CHECK(peer != shared_peer_.end(), "pipeline: ", name, " is not shared with another stage");
  autograd::NoGradGuard no_grad;
  const int64_t tag = shared_tag_.at(name);
  transport_->post_send(gradient.clone(), peer->second, tag, Channel::kControl);
  const Tensor other = transport_->receive(gradient.device(), peer->second, tag, Channel::kControl);
  // a + b is b + a bit for bit, so both copies get the same sum.
  backend_for(gradient.device()).binary(BinaryOp::kAdd, gradient, other.reshape(gradient.shape()), gradient);
}

void PipelineStage::sum_over_stages(const Tensor& tensor) {
  group_->all_reduce(tensor, Reduction::kSum, CommStream())->wait();
}

std::vector<double> PipelineStage::gather_over_stages(double value) {
  const Device device = group_->device();
  const Tensor mine = Tensor::full({1}, value, accumulation_dtype(device), device);
  const Tensor all = Tensor::empty({placement_.stages}, accumulation_dtype(device), device);
  group_->all_gather(mine, all, CommStream())->wait();
  return all.to(Device::cpu()).to_vector();
}

void PipelineStage::max_over_stages(Tensor& tensor) {
  Tensor on_group = tensor.to(group_->device());
  group_->all_reduce(on_group, Reduction::kMax, CommStream())->wait();
  tensor = on_group.to(tensor.device());
}

Tensor PipelineStage::forward_through_stages(const std::vector<ModelSegment>& local_segments, const Tensor& ids) {
  const int virtual_stages = placement_.virtual_stages();
  Tensor logits;
  for (int chunk = 0; chunk < placement_.chunks; ++chunk) {
    const int j = placement_.virtual_stage(chunk);
    Tensor x = j == 0 ? ids
                      : transport_->receive(ids.device(), placement_.stage_of(j - 1), kEvaluationTag + j - 1,
                                            Channel::kControl);
    for (int s = placement_.first_segment[j]; s < placement_.first_segment[j + 1]; ++s) {
      x = local_segments[static_cast<size_t>(s)].forward(x);
    }
    if (j + 1 < virtual_stages) {
      transport_->post_send(x, placement_.stage_of(j + 1), kEvaluationTag + j, Channel::kControl);
    } else {
      logits = x;
    }
  }
  transport_->finish_sends();
  return logits;
}

std::map<std::string, Tensor> PipelineStage::gather_to_first_stage(const std::map<std::string, Tensor>& tensors) {
  if (placement_.stage != 0) {
    std::string names;
    for (const auto& [name, tensor] : tensors) names += name + "\n";
    transport_->post_send(text_tensor(names), 0, kGatherTag, Channel::kControl);
    for (const auto& [name, tensor] : tensors) transport_->post_send(tensor, 0, kGatherTag, Channel::kControl);
    transport_->finish_sends();
    return tensors;
  }
  std::map<std::string, Tensor> merged = tensors;
  for (int stage = 1; stage < placement_.stages; ++stage) {
    // Messages of one sender under one tag arrive in the order sent.
    const std::string names = tensor_text(transport_->receive(Device::cpu(), stage, kGatherTag, Channel::kControl));
    size_t start = 0;
    for (size_t end = names.find('\n'); end != std::string::npos; start = end + 1, end = names.find('\n', start)) {
      const std::string name = names.substr(start, end - start);
      Tensor tensor = transport_->receive(Device::cpu(), stage, kGatherTag, Channel::kControl);
      WEFT_CHECK(merged.emplace(name, std::move(tensor)).second, "pipeline checkpoint: stage ", stage, " and a lower "
                 "stage both hold '", name, "'");
    }
  }
  return merged;
}

double PipelineStage::measured_bubble(const graph::StepTimeline& timeline) {
  // The papers' bubble: over the pipeline's span, from the step's start (the stages leave the
  // previous step's collectives together) to the end of the last compute on any stage, the share
  // in which a stage ran no forward or backward; the mean over the stages. One all-gather of each
  // stage's (last end, busy time) pair gives every rank both the span and every stage's share.
  std::vector<graph::Interval> compute;
  double last = 0.0;
  for (const graph::NodeTiming& node : timeline.nodes) {
    if (node.signal || (node.kind != graph::NodeKind::kForward && node.kind != graph::NodeKind::kBackward)) continue;
    last = std::max(last, node.end_ms);
    compute.push_back({node.start_ms, node.end_ms});
  }
  const Device device = group_->device();
  const std::vector<double> mine = {last, graph::union_length(compute)};
  const Tensor local = Tensor::from_vector(absl::Span<const double>(mine), {2}, accumulation_dtype(device)).to(device);
  const Tensor all = Tensor::empty({2 * placement_.stages}, accumulation_dtype(device), device);
  group_->all_gather(local, all, CommStream())->wait();
  const std::vector<double> stages = all.to(Device::cpu()).to_vector();  // (last end, busy) per stage
  double makespan = 0.0;
  for (size_t s = 0; s < stages.size(); s += 2) makespan = std::max(makespan, stages[s]);
  if (makespan <= 0.0) return 0.0;
  double idle = 0.0;
  for (size_t s = 1; s < stages.size(); s += 2) idle += 1.0 - stages[s] / makespan;
  return idle / static_cast<double>(placement_.stages);
}

}  // namespace weft
