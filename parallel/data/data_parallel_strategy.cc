// DataParallelStrategy (data_parallel_strategy.h) and make_strategy (parallel/strategy.h).
#include "parallel/data/data_parallel_strategy.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <set>

#include "parallel/comm/hierarchical_all_reduce.h"
#include "parallel/comm/world_exchange.h"
#include "parallel/tensor/sharding.h"
#include "parallel/tensor/tensor_parallel_norm.h"
#include "parallel/tensor/tensor_parallel_plan.h"
#include "parallel/tensor/vocab_parallel.h"
#include "runtime/ops/loss.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduction.h"

namespace weft {
namespace {

// Per parameter, the segment whose backward makes its gradient final: the lowest segment that
// reads it (backward reaches it last). A parameter no segment names is final only after the whole
// backward (segment 0).
std::vector<int> final_segments(const GradientBuffer& buffer, const std::vector<ModelSegment>& segments) {
  std::map<std::string, int> first_reader;
  for (int s = static_cast<int>(segments.size()); s-- > 0;) {
    for (const std::string& name : segments[s].parameters) first_reader[name] = s;
  }
  std::vector<int> final_segment;
  for (const NamedParameter& parameter : buffer.parameters()) {
    const auto found = first_reader.find(parameter.name);
    final_segment.push_back(found == first_reader.end() ? 0 : found->second);
  }
  return final_segment;
}

// Per bucket, the segment whose backward completes it: the lowest final segment of its parameters.
std::vector<int> ready_segments(const GradientBuffer& buffer, const std::vector<int>& final_segment) {
  std::vector<int> ready(buffer.buckets().size(), INT_MAX);
  for (size_t b = 0; b < buffer.buckets().size(); ++b) {
    for (const GradientBuffer::Slot& slot : buffer.buckets()[b].slots) {
      ready[b] = std::min(ready[b], final_segment[slot.parameter]);
    }
  }
  return ready;
}

// Per segment, the buckets holding a parameter its forward reads (all buckets for a parameter no
// segment names, which the first segment then waits for).
std::vector<std::vector<size_t>> segment_buckets(const GradientBuffer& buffer, const std::vector<ModelSegment>& segments) {
  std::map<std::string, size_t> bucket_of;
  for (size_t i = 0; i < buffer.parameters().size(); ++i) bucket_of[buffer.parameters()[i].name] = buffer.bucket_of(i);
  std::vector<std::set<size_t>> sets(segments.size());
  std::set<std::string> named;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (const std::string& name : segments[s].parameters) {
      const auto found = bucket_of.find(name);
      WEFT_CHECK(found != bucket_of.end(), "model segment '", segments[s].name, "' names parameter '", name,
                 "', which the model does not have");
      sets[s].insert(found->second);
      named.insert(name);
    }
  }
  for (const auto& [name, bucket] : bucket_of) {
    if (named.count(name) == 0) sets[0].insert(bucket);
  }
  std::vector<std::vector<size_t>> out;
  for (const std::set<size_t>& set : sets) out.emplace_back(set.begin(), set.end());
  return out;
}

// The parameters this rank trains: all of the model's, or its pipeline stage's.
std::vector<NamedParameter> trained_parameters(LanguageModel& model, const PipelineStage* pipeline) {
  return pipeline != nullptr ? pipeline->local_parameters(model.named_parameters()) : model.named_parameters();
}

// Their tensors, for clipping: in Module::parameters() order without a pipeline (the order the
// gradient norm's squares are summed in, which a model may give otherwise than
// named_parameters()), the stage's named order with one.
std::vector<Tensor> trained_tensors(LanguageModel& model, const PipelineStage* pipeline) {
  if (pipeline == nullptr) return model.parameters();
  std::vector<Tensor> tensors;
  for (const NamedParameter& parameter : trained_parameters(model, pipeline)) tensors.push_back(parameter.tensor);
  return tensors;
}

}  // namespace

DataParallelStrategy::DataParallelStrategy(std::shared_ptr<ProcessGroup> group, int world_rank, LanguageModel& model,
                                           const StrategyOptions& options, std::shared_ptr<PipelineStage> pipeline)
    : group_(std::move(group)), model_(model), tp_(options.tensor_parallel), pipeline_(std::move(pipeline)),
      world_rank_(world_rank), options_(options), mode_(graph::parse_comm_mode(options.comm_mode)),
      device_(group_->device()), parameters_(trained_tensors(model, pipeline_.get())),
      buffer_(trained_parameters(model, pipeline_.get()), options.bucket_bytes, group_->size()),
      executor_(group_->device()) {
  WEFT_CHECK(options.zero_stage >= 0 && options.zero_stage <= 2, "parallel.zero = ", options.zero_stage,
             " is not one of 0, 1, 2");
  WEFT_CHECK(options.make_optimizer != nullptr, "strategy: no optimizer factory given");
  buffer_.attach();
  if (options.zero_stage > 0) {
    zero_ = std::make_unique<ZeroSharding>(options.zero_stage, buffer_, group_);
    optimizer_ = zero_->make_optimizer(options.make_optimizer, options.weight_decay);
  } else {
    optimizer_ = options.make_optimizer(default_parameter_groups(buffer_.parameters(), options.weight_decay));
  }
  gather_pending_.assign(buffer_.buckets().size(), 0);
  if (zero_ != nullptr && tp_ != nullptr) zero_->set_tensor_parallel(tp_);

  segments_ = model.segments();
  if (tp_ != nullptr && tp_->size() > 1) {
    // The manual model changes layouts itself; the auto mode's plan needs them between segments.
    if (mode_ == graph::CommMode::kAuto) segments_ = tensor_parallel_segments(segments_, *tp_, options.sequence_parallel);
    loss_ = [tp = tp_](const Tensor& logits, const Tensor& targets, int64_t counted) {
      return vocab_parallel_cross_entropy(logits, targets, -100, counted, *tp);
    };
    std::vector<double> split;
    for (const NamedParameter& parameter : buffer_.parameters()) split.push_back(parameter.layout.is_split() ? 1.0 : 0.0);
    split_mask_ = Tensor::from_vector(absl::Span<const double>(split), {static_cast<int64_t>(split.size())},
                                      accumulation_dtype(device_)).to(device_);
    // A partial gradient is complete once the last micro-batch's backward has accumulated it: its
    // sum over tp runs then, before the parameter's bucket hears that it is ready (these hooks are
    // registered first, so they run first).
    alive_ = std::make_shared<char>(0);
    for (const NamedParameter& parameter : buffer_.parameters()) {
      if (!parameter.partial_gradient) continue;
      Tensor tensor = parameter.tensor;
      tensor.register_grad_ready_hook([alive = std::weak_ptr<char>(alive_), state = &state_, tp = tp_](Tensor& leaf) {
        if (alive.expired() || !state->last_micro_batch) return;
        tp->group->all_reduce(leaf.grad(), Reduction::kSum, tp->stream)->wait();
      });
    }
  }

  if (pipeline_ != nullptr) {
    // Other stages' segments keep their places (the graph indexes segments globally) but run nothing
    // here and name no parameter of this rank.
    segments_ = pipeline_->local_segments(segments_);
    std::vector<double> counted;
    for (const NamedParameter& parameter : buffer_.parameters()) {
      counted.push_back(pipeline_->is_second_copy(parameter.name) ? 0.0 : 1.0);
    }
    counted_mask_ = Tensor::from_vector(absl::Span<const double>(counted), {static_cast<int64_t>(counted.size())},
                                        accumulation_dtype(device_)).to(device_);
    if (zero_ != nullptr) zero_->set_pipeline(pipeline_, counted);
  }

  // ZeRO needs its reductions (into the shard) and gathers (back into the model) even on one rank; a
  // pipeline its shared gradients' sums and the loss's sum over the stages.
  const bool communicate = group_->size() > 1 || zero_ != nullptr || options.collectives_for_one_rank ||
                           pipeline_ != nullptr;
  const bool reduce_over_dp = group_->size() > 1 || zero_ != nullptr || options.collectives_for_one_rank;
  if (communicate && device_.is_cpu()) {
    // The executor's dp_comm thread runs collectives on a stream of its own. A stream's first use in
    // a group creates its communicator, collectively: make it here, on one thread, in one order on
    // every rank, rather than from two threads at once during a step.
    dp_comm_ = CommStream::caller("dp_comm");
    group_->barrier(CommStream())->synchronize();
    group_->barrier(dp_comm_)->synchronize();
  }

  StepRecipe recipe;
  recipe.segments = segments_;
  recipe.loss = loss_;
  recipe.micro_batches = options.micro_batches;
  recipe.device = device_;
  recipe.update = [this](StepState& state) { update(state); };
  recipe.fault = FaultInjection::from_environment();
  recipe.world_rank = world_rank;
  // A grad-ready hook, a tensor-parallel sum or a pipeline's shared gradient would read what the
  // second stream is still writing: only a lone process without collectives overlaps.
  recipe.overlap_weight_gradients = !communicate && pipeline_ == nullptr && (tp_ == nullptr || tp_->size() == 1) &&
                                    options.weight_gradient_stream.value_or(weight_gradient_stream_setting());
  if (communicate) {
    BucketReductions reductions;
    reductions.final_segment = final_segments(buffer_, recipe.segments);
    reductions.ready_segment = ready_segments(buffer_, reductions.final_segment);
    for (size_t i = 0; i < buffer_.parameters().size(); ++i) reductions.bucket_of_parameter.push_back(buffer_.bucket_of(i));
    for (const GradientBuffer::Bucket& bucket : buffer_.buckets()) {
      reductions.bytes.push_back(bucket.padded_elements * dtype_size(buffer_.dtype()));
    }
    reductions.operation = options.zero_stage == 2 ? "reduce_scatter" : "all_reduce";
    // A pipeline's shared parameters (a tied embedding) are summed with the other stage's copy first,
    // so that both copies' buckets reduce the same gradient.
    std::vector<std::vector<size_t>> shared(buffer_.buckets().size());
    for (size_t i = 0; i < buffer_.parameters().size(); ++i) {
      if (pipeline_ != nullptr && pipeline_->is_shared(buffer_.parameters()[i].name)) shared[buffer_.bucket_of(i)].push_back(i);
    }
    for (const std::vector<size_t>& parameters : shared) reductions.exchanges_with_stage.push_back(!parameters.empty());
    reductions.reduce = [this, shared, reduce_over_dp](size_t bucket, const graph::NodeContext& context) -> CompletionPtr {
      // A slot whose parameter got no gradient this step still counts as zero (lazy zeroing): its
      // zeros are written here, on the collective's stream, before the bucket is reduced whole.
      buffer_.materialize(bucket);
      for (size_t i : shared[bucket]) {
        const NamedParameter& parameter = buffer_.parameters()[i];
        pipeline_->sum_shared_gradient(parameter.name, parameter.tensor.grad());
      }
      if (!reduce_over_dp) return nullptr;
      const CommStream stream = stream_for(context);
      if (zero_ != nullptr) return zero_->reduce_bucket(bucket, stream);
      if (options_.hierarchical_all_reduce != nullptr) {
        return options_.hierarchical_all_reduce->all_reduce(buffer_.buckets()[bucket].data, Reduction::kAverage, stream);
      }
      return group_->all_reduce(buffer_.buckets()[bucket].data, Reduction::kAverage, stream);
    };
    if (mode_ == graph::CommMode::kManual) {
      reducer_ = std::make_shared<ManualReducer>(std::move(reductions));
    } else {
      reducer_ = std::make_shared<OverlappedReducer>(std::move(reductions));
    }
    recipe.reducer = reducer_.get();
    // The hooks outlive this strategy on the model's parameters: they hold the reducer weakly.
    for (size_t i = 0; i < buffer_.parameters().size(); ++i) {
      Tensor parameter = buffer_.parameters()[i].tensor;
      parameter.register_grad_ready_hook([reducer = std::weak_ptr<Reducer>(reducer_), i](Tensor&) {
        if (std::shared_ptr<Reducer> alive = reducer.lock()) alive->gradient_ready(i);
      });
    }
    recipe.average_loss = [this, reduce_over_dp](const graph::NodeContext& context) -> CompletionPtr {
      if (pipeline_ == nullptr) return group_->all_reduce(state_.loss_sum, Reduction::kAverage, stream_for(context));
      // Only the last stage has a loss: the dp mean, then the sum over the stages.
      if (reduce_over_dp) group_->all_reduce(state_.loss_sum, Reduction::kAverage, stream_for(context))->wait();
      pipeline_->sum_over_stages(state_.loss_sum);
      return nullptr;
    };
    if (zero_ != nullptr) {
      auto gathers = std::make_unique<ParameterGathers>();
      for (const GradientBuffer::Bucket& bucket : buffer_.buckets()) {
        gathers->bytes.push_back(bucket.padded_elements / group_->size() * dtype_size(kFloat32));
      }
      gathers->segment_buckets = segment_buckets(buffer_, recipe.segments);
      gathers->before_forward = mode_ == graph::CommMode::kAuto;
      gathers->gather = [this](size_t bucket, const graph::NodeContext& context) -> CompletionPtr {
        if (!gather_pending_[bucket]) return nullptr;  // no update since the last gather (first step, skipped step)
        gather_pending_[bucket] = 0;
        return zero_->gather_bucket(bucket, stream_for(context));
      };
      recipe.gathers = std::move(gathers);
    }
  }
  if (pipeline_ != nullptr) {
    PipelineRecipe pipeline_recipe;
    pipeline_recipe.step = std::move(recipe);
    pipeline_recipe.placement = pipeline_->placement();
    pipeline_recipe.schedule = pipeline_->schedule();
    pipeline_recipe.transport = &pipeline_->transport();
    pipeline_recipe.post_receives_early = mode_ == graph::CommMode::kAuto;
    PipelineStepGraph built = build_pipeline_step_graph(pipeline_recipe, state_);
    graph_ = std::move(built.graph);
    plan_ = graph::Scheduler::plan(graph_, mode_, built.ordering);
  } else {
    graph_ = build_step_graph(recipe, state_);
    plan_ = graph::Scheduler::plan(graph_, mode_);
  }
  if (communicate && device_.is_cpu()) group_->barrier(CommStream())->synchronize();
  origin_ms_ = clock_ms();
}

CommStream DataParallelStrategy::stream_for(const graph::NodeContext& context) const {
  if (context.stream() == graph::StreamClass::kCompute) return CommStream();  // manual: in line with compute
  if (context.cuda_stream() != nullptr) return CommStream::cuda(context.cuda_stream(), context.device().index);
  return dp_comm_;
}

void DataParallelStrategy::update(StepState& state) {
  autograd::NoGradGuard no_grad;
  Backend& backend = backend_for(device_);
  // Clip and update on the device: the norm and the decision to skip never come to the host here.
  Tensor clip_factor;  // [1] on the device, when the optimizer applies the clipping itself
  if (zero_ != nullptr) {
    state.grad_squares = zero_->clip_gradients(options_.grad_clip, CommStream());
  } else {
    std::vector<Tensor> grads;
    for (const Tensor& parameter : parameters_) grads.push_back(parameter.grad());
    state.grad_squares = Tensor::empty({static_cast<int64_t>(grads.size())}, accumulation_dtype(device_), device_);
    backend.squared_norms(grads, state.grad_squares);
    if (split_mask_.defined()) state.grad_squares = tensor_parallel_squares(state.grad_squares, split_mask_);
    if (pipeline_ != nullptr) {
      // The whole model's norm: every stage's parameters, a shared one counted once.
      state.grad_squares = sum(mul(state.grad_squares, counted_mask_)).reshape({1});
      pipeline_->sum_over_stages(state.grad_squares);
    }
    if (options_.grad_clip > 0.0 && optimizer_->takes_gradient_scale()) {
      // The update applies the clipping factor as it reads each gradient: no pass that scales them.
      clip_factor = Tensor::empty({1}, accumulation_dtype(device_), device_);
      backend.clip_factor(state.grad_squares, options_.grad_clip, clip_factor);
    } else {
      backend.clip_to_norm(grads, state.grad_squares, options_.grad_clip);
    }
  }
  // The guard is finite exactly when the loss and the gradient norm both are (their sum, on the
  // device): a NaN or Inf in either skips the update, decided without a host read.
  const Tensor guard = add(state.loss_sum, sum(state.grad_squares).reshape({1}));
  // A step still in flight (issued, not finished: this runs inside issue_step) may turn out skipped;
  // its guard tells the device to update with the counts that skip leaves. Kept alive until then.
  const Tensor previous_guard = issued_.empty() ? Tensor() : last_guard_;
  if (clip_factor.defined()) {
    optimizer_->step_with_gradient_scale(state.lr, guard, clip_factor, previous_guard);
  } else {
    optimizer_->step(state.lr, guard, previous_guard);
  }
  last_guard_ = guard;
  if (zero_ != nullptr) gather_pending_.assign(gather_pending_.size(), 1);
  buffer_.zero();  // in place: every .grad stays a view of its bucket
}

int DataParallelStrategy::max_steps_in_flight() const {
  return pipeline_ != nullptr ? 1 : graph::Executor::kMaxStepsInFlight;
}

void DataParallelStrategy::issue_step(int64_t step, double lr, const MicroBatchSource& next_micro_batch) {
  WEFT_CHECK(static_cast<int>(issued_.size()) < max_steps_in_flight(), "Strategy::issue_step: step ", step,
             " issued while ", issued_.size(), " step(s) are in flight, and this run allows ", max_steps_in_flight(),
             pipeline_ != nullptr ? " (a pipeline completes its sends each step)" : "",
             "; call finish_step first");
  state_.next_micro_batch = next_micro_batch;
  state_.lr = lr;
  state_.step = step;
  const std::shared_ptr<CollectiveRecorder> recorder =
      options_.tensor_parallel != nullptr ? options_.tensor_parallel->recorder : nullptr;
  if (recorder != nullptr) recorder->begin();
  try {
    // The loss and the gradient norm's squares are copied to the host at the step's end, before a
    // step issued after this one can overwrite them.
    executor_.issue(graph_, plan_, [this] { return std::vector<Tensor>{state_.loss_sum, state_.grad_squares}; });
  } catch (...) {
    state_.next_micro_batch = nullptr;
    if (recorder != nullptr) recorder->take();
    throw;
  }
  state_.next_micro_batch = nullptr;
  IssuedStep issued;
  issued.step = step;
  if (recorder != nullptr) issued.recorded = recorder->take();
  issued_.push_back(std::move(issued));
}

StepReport DataParallelStrategy::finish_step() {
  WEFT_CHECK(!issued_.empty(), "Strategy::finish_step: no step is in flight; issue_step first");
  const IssuedStep issued = std::move(issued_.front());
  issued_.pop_front();
  const int64_t step = issued.step;
  graph::Executor::FinishedStep finished = executor_.finish();
  graph::StepTimeline& timeline = finished.timeline;
  add_recorded_collectives(issued.recorded, finished.device_start, timeline);
  const double bubble = pipeline_ != nullptr ? pipeline_->measured_bubble(timeline) : 0.0;
  if (pipeline_ != nullptr) pipeline_->transport().finish_sends();
  if (options_.trace) {
    const double started_ms = timeline.start_clock_ms - origin_ms_;
    std::string events = timeline.chrome_trace_events(world_rank_, str("rank ", world_rank_), started_ms);
    // A marker where each step begins, so that a reader (weft-compare's picture) can find one step.
    events += str(events.empty() ? "" : ",\n", "{\"ph\": \"i\", \"s\": \"p\", \"cat\": \"step\", \"name\": \"step ", step,
                  "\", \"pid\": ", world_rank_, ", \"tid\": 0, \"ts\": ", static_cast<int64_t>(started_ms * 1000.0),
                  ", \"args\": {\"step\": ", step, ", \"step_ms\": ", timeline.step_ms, "}}");
    if (pipeline_ != nullptr) {
      // A counter row per rank: the step's measured bubble next to the schedule's.
      events += str(events.empty() ? "" : ",\n", "{\"ph\": \"C\", \"name\": \"pipeline bubble\", \"pid\": ", world_rank_,
                    ", \"ts\": ", static_cast<int64_t>(started_ms * 1000.0), ", \"args\": {\"measured\": ", bubble,
                    ", \"theory\": ", pipeline_->theoretical_bubble(), "}}");
    }
    if (!events.empty()) trace_events_ += (trace_events_.empty() ? "" : ",") + events;
  }
  // The host copies of the step's loss and squares (Executor::issue's read-back): no device read here.
  StepReport report;
  report.loss = finished.read_back[0].item();
  double sum_of_squares = 0.0;
  for (double value : finished.read_back[1].to_vector()) sum_of_squares += value;
  const double grad_norm = std::sqrt(sum_of_squares);
  // A skipped step reports its non-finite norm too: a log or metrics file showing a norm of 0 would
  // read as a step with no gradient.
  report.grad_norm = grad_norm;
  if (!std::isfinite(report.loss) || !std::isfinite(grad_norm)) {
    // The loss is the mean over the global batch and the norm that of the averaged gradients (all
    // ranks agree on both), so every rank takes the same decision. The device has already skipped
    // the update; the optimizer forgets its counts. A step issued after this one has already
    // updated with the lower counts (its previous guard), so only the host's counts are behind:
    // this step's are the ones issued_.size() step() calls before the last.
    const std::string what = !std::isfinite(report.loss) ? str("the training loss is ", report.loss)
                                                         : str("the gradient norm is ", grad_norm);
    WEFT_CHECK(options_.on_nan == "skip", what, " at step ", step,
               " (train.on_nan: stop); lower train.lr, raise train.warmup_steps, or set train.on_nan: skip");
    optimizer_->undo_step(static_cast<int>(issued_.size()));
    report.skipped = true;
  }
  report.compute_ms = timeline.compute_ms;
  report.comm_ms = timeline.comm_ms;
  report.exposed_comm_ms = timeline.exposed_comm_ms;
  report.overlap_ratio = timeline.overlap_ratio;
  report.end_clock_ms = timeline.end_clock_ms;
  if (pipeline_ != nullptr) {
    report.pipeline_bubble = bubble;
    report.pipeline_bubble_theory = pipeline_->theoretical_bubble();
  }
  return report;
}

void DataParallelStrategy::check_no_step_in_flight(const char* what) const {
  WEFT_CHECK(issued_.empty(), "Strategy::", what, ": ", issued_.size(),
             " step(s) issued and not finished; call finish_step first (their updates are not applied yet)");
}

void DataParallelStrategy::complete_parameter_updates() {
  check_no_step_in_flight("complete_parameter_updates");
  for (size_t bucket = 0; bucket < gather_pending_.size(); ++bucket) {
    if (!gather_pending_[bucket]) continue;
    gather_pending_[bucket] = 0;
    zero_->gather_bucket(bucket, CommStream())->synchronize();
  }
}

double DataParallelStrategy::average(double value) {
  if (group_->size() == 1 && pipeline_ == nullptr) return value;
  Tensor scalar = Tensor::full({1}, value, accumulation_dtype(device_), device_);
  if (group_->size() > 1) group_->all_reduce(scalar, Reduction::kAverage, CommStream())->synchronize();
  if (pipeline_ == nullptr) return scalar.item();
  // Over the stages too, so that every rank of the world agrees.
  pipeline_->sum_over_stages(scalar);
  return scalar.item() / static_cast<double>(pipeline_->stages());
}

void DataParallelStrategy::wait_for_all_ranks() { wait_for_every_rank(); }

Tensor DataParallelStrategy::tensor_parallel_squares(const Tensor& squares, const Tensor& split) const {
  // Each tp rank's squares of a split parameter are of its shard: their sum over tp is the whole
  // parameter's. A replicated parameter's are the same on every rank and count once.
  Tensor summed = squares.clone();
  tp_->group->all_reduce(summed, Reduction::kSum, tp_->stream)->wait();
  return squares_over_tensor_parallel_group(squares, summed, split);
}

double DataParallelStrategy::evaluation_loss(const Tensor& inputs, const Tensor& targets) {
  check_no_step_in_flight("evaluation_loss");
  autograd::NoGradGuard no_grad;
  if (pipeline_ != nullptr) {
    // The last stage computes the loss; the others learn it through the sum over the stages.
    const Tensor logits = pipeline_->forward_through_stages(segments_, inputs.to(device_));
    Tensor loss = Tensor::zeros({1}, accumulation_dtype(device_), device_);
    if (logits.defined()) {
      const Tensor flat_logits = logits.reshape({-1, logits.size(-1)});
      const Tensor flat_targets = targets.to(device_).reshape({-1});
      loss = (loss_ ? loss_(flat_logits, flat_targets, -1) : cross_entropy(flat_logits, flat_targets))
                 .reshape({1}).to(loss.dtype());
    }
    pipeline_->sum_over_stages(loss);
    return loss.item();
  }
  const Tensor logits = run_segments(segments_, inputs.to(device_));  // [B, T, V] or [B, T, V / tp]
  const Tensor flat_logits = logits.reshape({-1, logits.size(-1)});
  const Tensor flat_targets = targets.to(device_).reshape({-1});
  // -1: the targets are counted by the loss (the ignored ones left out), as cross_entropy does.
  const Tensor loss = loss_ ? loss_(flat_logits, flat_targets, -1) : cross_entropy(flat_logits, flat_targets);
  return loss.item();
}

std::map<std::string, Tensor> DataParallelStrategy::model_state() {
  check_no_step_in_flight("model_state");
  std::map<std::string, Tensor> state;
  for (const NamedParameter& parameter : buffer_.parameters()) {
    // A shared parameter is saved by the lower stage holding it.
    if (pipeline_ != nullptr && pipeline_->is_second_copy(parameter.name)) continue;
    state[parameter.name] = tp_ != nullptr ? gather_full(parameter.tensor, parameter.layout, *tp_) : parameter.tensor;
  }
  return pipeline_ != nullptr ? pipeline_->gather_to_first_stage(state) : state;
}

void DataParallelStrategy::load_model_state(const std::map<std::string, Tensor>& state) {
  check_no_step_in_flight("load_model_state");
  if (tp_ == nullptr) {
    model_.load_state_dict(state);
    return;
  }
  std::map<std::string, Tensor> shards;
  for (const NamedParameter& parameter : model_.named_parameters()) {
    const auto found = state.find(parameter.name);
    if (found == state.end()) continue;  // load_state_dict names what is missing
    WEFT_CHECK(shard_shape(found->second.shape(), parameter.layout, tp_->size()) == parameter.tensor.shape(),
               "checkpoint: parameter ", parameter.name, " is ", found->second.describe(), ", which does not give this "
               "rank's shard ", shape_string(parameter.tensor.shape()), " at parallel.tp = ", tp_->size(),
               "; it was saved from another model");
    shards[parameter.name] = shard_of(found->second, parameter.layout, tp_->rank(), tp_->size());
  }
  for (const auto& [name, tensor] : state) {
    if (shards.count(name) == 0) shards[name] = tensor;  // unexpected names: load_state_dict reports them
  }
  model_.load_state_dict(shards);
}

const NamedParameter* DataParallelStrategy::owner_of(const std::string& key) const {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos) return nullptr;
  const std::string name = key.substr(0, dot);
  for (const NamedParameter& parameter : buffer_.parameters()) {
    if (parameter.name == name) return &parameter;
  }
  return nullptr;
}

std::map<std::string, Tensor> DataParallelStrategy::optimizer_state() {
  check_no_step_in_flight("optimizer_state");
  std::map<std::string, Tensor> state =
      zero_ != nullptr ? zero_->gather_parameter_state(*optimizer_, CommStream()) : optimizer_->state_dict();
  if (tp_ != nullptr) {
    for (auto& [key, tensor] : state) {
      const NamedParameter* parameter = owner_of(key);
      if (parameter != nullptr && tensor.shape() == parameter->tensor.shape()) {
        tensor = gather_full(tensor.to(parameter->tensor.device()), parameter->layout, *tp_);
      }
    }
  }
  if (pipeline_ == nullptr) return state;
  // Stage 0 keeps the step-wide entries ("step"); each parameter's state comes from the stage that
  // saves the parameter.
  for (auto entry = state.begin(); entry != state.end();) {
    const NamedParameter* parameter = owner_of(entry->first);
    const bool drop = parameter == nullptr ? pipeline_->stage() != 0 : pipeline_->is_second_copy(parameter->name);
    entry = drop ? state.erase(entry) : std::next(entry);
  }
  return pipeline_->gather_to_first_stage(state);
}

void DataParallelStrategy::load_optimizer_state(const std::map<std::string, Tensor>& saved) {
  check_no_step_in_flight("load_optimizer_state");
  std::map<std::string, Tensor> state = saved;
  if (tp_ != nullptr) {
    for (auto& [key, tensor] : state) {
      const NamedParameter* parameter = owner_of(key);
      if (parameter != nullptr && tensor.dim() > 0 &&
          shard_shape(tensor.shape(), parameter->layout, tp_->size()) == parameter->tensor.shape()) {
        tensor = shard_of(tensor, parameter->layout, tp_->rank(), tp_->size());
      }
    }
  }
  const bool flat = std::any_of(state.begin(), state.end(), [](const auto& entry) {
    return entry.first.size() > 5 && entry.first.compare(entry.first.size() - 5, 5, ".flat") == 0;
  });
  if (zero_ != nullptr) {
    // The shard from the loaded parameters, then the checkpoint's f32 master values over it.
    zero_->load_shard_from_parameters();
    WEFT_CHECK(!flat || tp_ == nullptr, "checkpoint: this optimizer state is in the flat layout of an older weft, "
               "which resumes at the same parallel.dp, parallel.zero and parallel.tp = 1 only");
    if (flat) {
      zero_->scatter_optimizer_state(*optimizer_, state);
    } else {
      zero_->scatter_parameter_state(*optimizer_, state);
    }
    return;
  }
  WEFT_CHECK(!flat, "checkpoint: this optimizer state is in the flat layout of parallel.zero 1 or 2 of an older "
             "weft; resume it with the parallel.dp and parallel.zero it was saved with");
  // Keys this optimizer keeps; master weights a checkpoint without them lacks are the parameters'
  // values (an f32 run's parameters are its weights), and ones it has but this optimizer does not
  // keep are dropped.
  std::map<std::string, Tensor> local = optimizer_->state_dict();
  for (auto& [key, tensor] : local) {
    const auto found = state.find(key);
    if (found != state.end()) {
      tensor = found->second;
    } else if (const NamedParameter* parameter = owner_of(key); parameter != nullptr && key.size() > 7 &&
               key.compare(key.size() - 7, 7, ".master") == 0) {
      tensor = parameter->tensor.to(tensor.dtype());
    } else {
      WEFT_FAIL("checkpoint: optimizer state lacks '", key, "'; it was saved with another optimizer");
    }
  }
  optimizer_->load_state_dict(local);
}

std::map<std::string, uint64_t> DataParallelStrategy::random_state(const std::map<std::string, uint64_t>& local) {
  if (pipeline_ == nullptr) return local;
  // A stream's position only grows, and only the stage running its module draws from it: the
  // largest position over the stages is that stage's.
  std::vector<double> offsets;
  for (const auto& [name, offset] : local) offsets.push_back(static_cast<double>(offset));
  Tensor positions = Tensor::from_vector(absl::Span<const double>(offsets), {static_cast<int64_t>(offsets.size())},
                                         kFloat64);
  pipeline_->max_over_stages(positions);
  const std::vector<double> largest = positions.to_vector();
  std::map<std::string, uint64_t> merged;
  size_t i = 0;
  for (const auto& [name, offset] : local) merged[name] = static_cast<uint64_t>(largest[i++]);
  return merged;
}

int64_t DataParallelStrategy::optimizer_state_bytes() const { return optimizer_->state_bytes(); }

void DataParallelStrategy::write_graph(const std::string& path) const { graph::write_graph(graph_, path); }

std::vector<double> DataParallelStrategy::per_stage(double value) {
  return pipeline_ != nullptr ? pipeline_->gather_over_stages(value) : std::vector<double>{value};
}

std::vector<std::string> DataParallelStrategy::description() const {
  std::vector<std::string> lines = pipeline_ != nullptr ? pipeline_->description() : std::vector<std::string>();
  lines.insert(lines.end(), options_.notes.begin(), options_.notes.end());
  return lines;
}

void DataParallelStrategy::write_trace(const std::string& path) {
  const std::vector<std::string> ranks = gather_text_to_rank_zero(trace_events_);
  if (world_rank_ != 0) return;
  std::string joined;
  for (const std::string& events : ranks) {
    if (!events.empty()) joined += (joined.empty() ? "" : ",") + events;
  }
  // The Chrome trace event format: chrome://tracing or ui.perfetto.dev draw a process per rank and
  // a thread per stream.
  std::ofstream trace(path);
  trace << "{\"traceEvents\": [" << joined << "]}\n";
  WEFT_CHECK(trace.good(), "log.trace_file: cannot write '", path, "'");
}

}  // namespace weft
