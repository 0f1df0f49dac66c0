// build_step_graph (step_builder.h).
#include "parallel/step/step_builder.h"

#include <algorithm>
#include <limits>

#include "runtime/autograd/engine.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/loss.h"

namespace weft {

using graph::NodeId;
using graph::NodeKind;
using graph::StreamClass;

// cross_entropy's default ignore_index: training batches hold token ids only, so every target counts.
constexpr int64_t kIgnoredTarget = -100;


Tensor load_micro_batch(StepState& state, int64_t micro, Device device) {
  MicroBatch batch = state.next_micro_batch();
  WEFT_CHECK(batch.inputs.device().is_cpu() && batch.targets.device().is_cpu() &&
                 batch.targets.shape() == batch.inputs.shape() && !is_floating(batch.targets.dtype()),
             "step: a micro-batch is ids and targets of one shape, i32 or i64, on the host; got ",
             batch.inputs.describe(), " and ", batch.targets.describe());
  // Counted here, on the host, so that cross-entropy needs no read back; through one raw pointer,
  // since the GPU waits for this node: reading each id through the tensor's accessors took about
  // 100 us of a GPT-2 step on the H200 machine (16,384 ids, 2026-12-03); on the development
  // machine 88-109 us against 5 us for std::count.
  const Tensor targets = batch.targets.contiguous();
  const int64_t n = targets.numel();
  int64_t ignored = 0;
  if (targets.dtype() == kInt64) {
    const int64_t* ids = targets.data<int64_t>();
    ignored = std::count(ids, ids + n, kIgnoredTarget);
  } else {
    const int32_t* ids = targets.data<int32_t>();
    ignored = std::count(ids, ids + n, static_cast<int32_t>(kIgnoredTarget));
  }
  state.counted_targets[micro] = n - ignored;
  state.targets[micro] = targets.to(device);
  return batch.inputs.to(device);
}

Tensor add_micro_batch_loss(StepState& state, const Tensor& output, int64_t micro, int64_t micro_batches,
                            const LossFunction& loss_of) {
  const int64_t vocabulary = output.size(-1);
  const Tensor logits = output.reshape({-1, vocabulary});
  const Tensor targets = state.targets[micro].reshape({-1});
  // Each micro-batch's mean loss is divided by their count, so the accumulated gradient is the
  // gradient of the mean over the whole step's batch: the seed its backward brings is 1 / count.
  const double seed = 1.0 / static_cast<double>(micro_batches);
  // The built-in loss computes its gradient in the forward pass, over the logits (which nothing
  // reads after the loss): one pass over [N, V] fewer.
  Tensor loss = loss_of ? loss_of(logits, targets, state.counted_targets[micro])
                        : cross_entropy_overwriting_logits(logits, targets, kIgnoredTarget,
                                                           state.counted_targets[micro], seed);
  if (micro_batches > 1) loss = scale(loss, seed);
  autograd::NoGradGuard no_grad;
  const Tensor value = loss.detach();
  backend_for(value.device()).binary(BinaryOp::kAdd, state.loss_sum, value.reshape({1}).to(state.loss_sum.dtype()),
                                     state.loss_sum);
  state.targets[micro] = Tensor();
  return loss;
}

void backward_segment(StepState& state, int s, int64_t micro, int segments) {
  std::vector<Tensor>& inputs = state.inputs[micro];
  std::vector<Tensor>& outputs = state.outputs[micro];
  std::vector<Tensor>& input_gradients = state.input_gradients[micro];
  // The loss starts from 1; a segment below from the gradient of the input of the segment above
  // it, which that segment's backward (or a pipeline receive) handed over.
  const Tensor gradient = s + 1 == segments ? Tensor() : input_gradients[s + 1];
  std::vector<Tensor> stops, producers;
  if (s > 0) {
    stops.push_back(inputs[s]);
    // The segment below starts its backward from what reaches inputs[s], unchanged, as the gradient
    // of its output (undefined here where that segment is another pipeline stage's): an op here may
    // do part of that output's producer's backward (runtime/ops/bias_gradient_handoff.h).
    producers.push_back(outputs[s - 1]);
  }
  std::vector<Tensor> reached = autograd::backward_to_inputs({outputs[s]}, {gradient}, stops, producers);
  outputs[s] = Tensor();
  if (s + 1 < segments) input_gradients[s + 1] = Tensor();
  if (s > 0) {
    inputs[s] = Tensor();
    WEFT_CHECK(reached[0].defined(), "backward of segment ", s, ": no gradient reached its input; "
               "every segment's output must depend on its input");
    input_gradients[s] = reached[0];
  }
}

std::vector<NodeId> add_parameter_gathers(graph::StepGraph& graph, const ParameterGathers& gathers,
                                          const std::vector<NodeId>& after) {
  const size_t count = gathers.bytes.size();
  std::vector<NodeId> nodes(count, -1);
  for (size_t k = count; k-- > 0;) {
    nodes[k] = graph.add_node({NodeKind::kCollective, str("all_gather bucket ", k), -1, StreamClass::kDpComm,
                               gathers.bytes[k],
                               [gather = gathers.gather, k](const graph::NodeContext& context) {
                                 return gather(k, context);
                               }},
                              after);
  }
  return nodes;
}

graph::StepGraph build_step_graph(const StepRecipe& recipe, StepState& state) {
  const int segments = static_cast<int>(recipe.segments.size());
  const int64_t micro_batches = recipe.micro_batches;
  WEFT_CHECK(segments >= 1 && micro_batches >= 1, "step builder: ", segments, " segments and ", micro_batches,
             " micro-batches; both must be at least 1");
  WEFT_CHECK(recipe.update != nullptr, "step builder: the recipe has no update");
  state.inputs.assign(micro_batches, std::vector<Tensor>(segments));
  state.outputs.assign(micro_batches, std::vector<Tensor>(segments));
  state.input_gradients.assign(micro_batches, std::vector<Tensor>(segments));
  state.targets.assign(micro_batches, Tensor());
  state.counted_targets.assign(micro_batches, 0);
  state.loss_sum = Tensor::zeros({1}, accumulation_dtype(recipe.device), recipe.device);
  state.weight_gradient_overlap.reset();
  if (recipe.overlap_weight_gradients) {
    WEFT_CHECK(recipe.reducer == nullptr, "step builder: weight gradients on a second stream need a recipe without "
               "a reducer (its grad-ready hooks would see gradients the compute stream has not waited for)");
    std::vector<std::vector<std::string>> parameters;
    for (const ModelSegment& segment : recipe.segments) parameters.push_back(segment.parameters);
    state.weight_gradient_overlap = std::make_shared<WeightGradientOverlap>(recipe.device, std::move(parameters));
  }

  graph::StepGraph graph;
  std::vector<NodeId> gather_nodes;
  if (recipe.gathers != nullptr && recipe.gathers->before_forward) gather_nodes = add_parameter_gathers(graph, *recipe.gathers, {});

  std::vector<NodeId> previous_forward(segments, -1), previous_backward(segments, -1);
  NodeId last_backward = -1;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const int mb = static_cast<int>(micro);
    const bool last_micro_batch = micro + 1 == micro_batches;
    std::vector<NodeId> forward(segments);
    for (int s = 0; s < segments; ++s) {
      std::vector<NodeId> dependencies;
      if (s > 0) dependencies.push_back(forward[s - 1]);
      if (s == 0 && previous_forward[0] >= 0) dependencies.push_back(previous_forward[0]);  // the data's order
      if (!gather_nodes.empty()) {
        for (size_t bucket : recipe.gathers->segment_buckets[s]) dependencies.push_back(gather_nodes[bucket]);
      }
      const bool last_segment = s + 1 == segments;
      forward[s] = graph.add_node(
          {NodeKind::kForward, str("forward ", recipe.segments[s].name, " mb", micro), mb, StreamClass::kCompute, 0,
           graph::task([&state, forward = recipe.segments[s].forward, loss_of = recipe.loss, device = recipe.device, s, micro,
                        micro_batches, last_segment, fault = recipe.fault, rank = recipe.world_rank] {
             if (fault && s == 0 && micro == 0) fault->at(rank, state.step, FaultInjection::Phase::kForward);
             std::vector<Tensor>& inputs = state.inputs[micro];
             std::vector<Tensor>& outputs = state.outputs[micro];
             Tensor input;
             if (s == 0) {
               if (micro == 0) state.loss_sum.zero_();
               input = load_micro_batch(state, micro, device);
             } else {
               // A leaf: this segment's backward stops here and hands its gradient down.
               input = outputs[s - 1].detach();
               input.set_requires_grad(true);
               inputs[s] = input;
             }
             Tensor output = forward(input);
             if (last_segment && micro == 0 && fault && fault->poisons_loss(rank, state.step)) {
               output = output * std::numeric_limits<double>::quiet_NaN();
             }
             if (last_segment) output = add_micro_batch_loss(state, output, micro, micro_batches, loss_of);
             outputs[s] = output;
           })},
          dependencies);
      previous_forward[s] = forward[s];
    }
    for (int s = segments - 1; s >= 0; --s) {
      std::vector<NodeId> dependencies{s + 1 < segments ? last_backward : forward[s]};
      if (previous_backward[s] >= 0) dependencies.push_back(previous_backward[s]);  // accumulation order
      const NodeId backward = graph.add_node(
          {NodeKind::kBackward, str("backward ", recipe.segments[s].name, " mb", micro), mb, StreamClass::kCompute, 0,
           [&state, reducer = recipe.reducer, s, micro, segments, last_micro_batch, fault = recipe.fault,
            rank = recipe.world_rank](const graph::NodeContext& context) -> CompletionPtr {
             if (fault && s == 0 && last_micro_batch) fault->at(rank, state.step, FaultInjection::Phase::kBackward);
             // The reducer hears of every gradient this backward finishes (grad-ready hooks).
             ReducerBracket bracket(reducer, s, last_micro_batch, context);
             state.last_micro_batch = last_micro_batch;
             if (WeightGradientOverlap* overlap = state.weight_gradient_overlap.get()) {
               overlap->before_backward(s);
               {
                 autograd::DeferWeightGradients defer(overlap->deferral());
                 backward_segment(state, s, micro, segments);
               }
               overlap->launch(s);
               // The micro-batch's gradients are complete: the next one accumulates into them, and
               // after the last the optimizer reads them.
               if (s == 0) overlap->join();
             } else {
               backward_segment(state, s, micro, segments);
             }
             return nullptr;
           }},
          dependencies);
      previous_backward[s] = backward;
      last_backward = backward;
      if (last_micro_batch && recipe.reducer != nullptr) recipe.reducer->segment_backward_added(graph, s, backward);
    }
  }
  std::vector<NodeId> before_update{last_backward};
  if (recipe.reducer != nullptr) {
    for (NodeId node : recipe.reducer->backward_finished(graph, last_backward)) before_update.push_back(node);
  }
  if (recipe.average_loss) {
    before_update.push_back(graph.add_node({NodeKind::kCollective, "all_reduce loss", -1, StreamClass::kDpComm,
                                            static_cast<int64_t>(state.loss_sum.element_size()), recipe.average_loss},
                                           {last_backward}));
  }
  // The update overwrites what the gathers of the previous update read (the shard weights).
  for (NodeId node : gather_nodes) before_update.push_back(node);
  const NodeId update = graph.add_node({NodeKind::kOptimizer, "optimizer", -1, StreamClass::kCompute, 0,
                                        graph::task([&state, update = recipe.update, fault = recipe.fault, rank = recipe.world_rank] {
                                          if (fault) fault->at(rank, state.step, FaultInjection::Phase::kOptimizer);
                                          update(state);
                                        })},
                                       before_update);
  if (recipe.gathers != nullptr && !recipe.gathers->before_forward) add_parameter_gathers(graph, *recipe.gathers, {update});
  return graph;
}

}  // namespace weft
