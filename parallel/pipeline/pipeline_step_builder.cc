// build_pipeline_step_graph (pipeline_step_builder.h).
#include "parallel/pipeline/pipeline_step_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace weft {

using graph::NodeId;
using graph::NodeKind;
using graph::StreamClass;

int PipelinePlacement::virtual_stage_of_segment(int segment) const {
  WEFT_CHECK(segment >= 0 && segment < first_segment.back(), "pipeline: segment ", segment, " is not one of ",
             first_segment.back());
  return static_cast<int>(std::upper_bound(first_segment.begin(), first_segment.end(), segment) -
                          first_segment.begin()) - 1;
}

int64_t pipeline_message_tag(bool gradient, int boundary, int64_t micro, int64_t micro_batches) {
  return (static_cast<int64_t>(boundary) * micro_batches + micro) * 2 + (gradient ? 1 : 0);
}

namespace {

// The ordering policy: every node once, dependencies first; among ready nodes the lowest key, then
// the earliest added.
graph::OrderingPolicy ordering_by_key(std::vector<double> keys) {
  return [keys = std::move(keys)](const graph::StepGraph& graph) {
    WEFT_CHECK(static_cast<int>(keys.size()) == graph.size(), "pipeline ordering: made for a graph of ", keys.size(),
               " nodes, given one of ", graph.size());
    using Entry = std::pair<double, NodeId>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
    std::vector<int> missing(graph.size());
    for (const graph::Node& node : graph.nodes()) {
      missing[node.id] = static_cast<int>(node.dependencies.size());
      if (missing[node.id] == 0) ready.push({keys[node.id], node.id});
    }
    std::vector<NodeId> order;
    while (!ready.empty()) {
      const NodeId id = ready.top().second;
      ready.pop();
      order.push_back(id);
      for (NodeId next : graph.node(id).dependents) {
        if (--missing[next] == 0) ready.push({keys[next], next});
      }
    }
    return order;
  };
}

}  // namespace

PipelineStepGraph build_pipeline_step_graph(const PipelineRecipe& recipe, StepState& state) {
  const StepRecipe& step = recipe.step;
  const PipelinePlacement& place = recipe.placement;
  const int segments = static_cast<int>(step.segments.size());
  const int64_t micro_batches = step.micro_batches;
  const int virtual_stages = place.virtual_stages();
  WEFT_CHECK(static_cast<int>(place.first_segment.size()) == virtual_stages + 1 && place.first_segment.front() == 0 &&
                 place.first_segment.back() == segments &&
                 std::is_sorted(place.first_segment.begin(), place.first_segment.end()) &&
                 std::adjacent_find(place.first_segment.begin(), place.first_segment.end()) == place.first_segment.end(),
             "pipeline: the placement does not cut ", segments, " segments into ", virtual_stages,
             " non-empty virtual stages");
  WEFT_CHECK(step.update != nullptr, "pipeline step builder: the recipe has no update");
  const bool split_backward = recipe.schedule == PipelineSchedule::kZeroBubble;

  state.inputs.assign(micro_batches, std::vector<Tensor>(segments));
  state.outputs.assign(micro_batches, std::vector<Tensor>(segments));
  state.input_gradients.assign(micro_batches, std::vector<Tensor>(segments + 1));
  state.targets.assign(micro_batches, Tensor());
  state.counted_targets.assign(micro_batches, 0);
  state.token_inputs.assign(micro_batches, Tensor());
  state.deferred.clear();
  if (split_backward) {
    state.deferred.resize(micro_batches);
    for (auto& per_segment : state.deferred) per_segment = std::vector<autograd::DeferredWeightGradients>(segments);
  }
  state.loss_sum = Tensor::zeros({1}, accumulation_dtype(step.device), step.device);

  PipelineStepGraph out;
  out.actions = pipeline_actions(recipe.schedule, {place.stages, static_cast<int>(micro_batches), place.chunks})[place.stage];
  graph::StepGraph& graph = out.graph;
  std::vector<double> keys;  // per node; NaN: not set, from its dependencies afterwards
  auto add = [&](graph::NodeSpec spec, const std::vector<NodeId>& dependencies, double key) {
    const NodeId id = graph.add_node(std::move(spec), dependencies);
    keys.resize(graph.size(), std::numeric_limits<double>::quiet_NaN());
    keys[id] = key;
    return id;
  };

  std::vector<NodeId> gathers;
  if (step.gathers != nullptr && step.gathers->before_forward) gathers = add_parameter_gathers(graph, *step.gathers, {});

  const bool first_rank = place.holds(0), last_rank = place.holds(segments - 1);
  // The lowest segment this rank holds: its backward of the last micro-batch is the stage's last.
  int lowest_segment = segments;
  for (int s = 0; s < segments; ++s) {
    if (place.holds(s)) lowest_segment = std::min(lowest_segment, s);
  }
  std::vector<NodeId> read(micro_batches, -1);
  std::vector<std::vector<NodeId>> forward(micro_batches, std::vector<NodeId>(segments, -1));
  std::vector<std::vector<NodeId>> backward(micro_batches, std::vector<NodeId>(segments, -1));
  std::vector<std::vector<NodeId>> weight(micro_batches, std::vector<NodeId>(segments, -1));
  Reducer* reducer = step.reducer;
  PipelineTransport* transport = recipe.transport;
  // A send that waits for its receiver on the host (parallel.pp_transport direct over MPI) runs off
  // the CUDA executor's issuing thread, as a receive does: it then holds only the compute list, as
  // NCCL's send holds only the compute stream.
  const bool sends_block_host = transport != nullptr && transport->sends_block_host();
  const Device device = step.device;
  // A receive's key: before the action it feeds, or (posted early) before the action before that.
  auto receive_key = [&](size_t k) { return recipe.post_receives_early ? static_cast<double>(k) - 1.5 : static_cast<double>(k) - 0.5; };
  bool first_forward = true;
  NodeId last_action_node = -1;
  NodeId last_send = -1;  // the stage's last send, in action order

  for (size_t k = 0; k < out.actions.size(); ++k) {
    const PipelineAction action = out.actions[k];
    const int m = action.micro_batch;
    const int64_t micro = m;
    const bool last_micro_batch = micro + 1 == micro_batches;
    const int j = place.virtual_stage(action.chunk);
    const int first = place.first_segment[j], end = place.first_segment[j + 1];
    const double key = static_cast<double>(k);

    if (action.kind == PipelineAction::Kind::kForward) {
      if ((first_rank || last_rank) && read[m] < 0) {
        std::vector<NodeId> after;
        if (m > 0) after.push_back(read[m - 1]);  // the data's order
        read[m] = add({NodeKind::kOther, str("read mb", m), m, StreamClass::kCompute, 0,
                       graph::task([&state, micro, device, first_rank, last_rank] {
                         const Tensor ids = load_micro_batch(state, micro, device);
                         if (first_rank) state.token_inputs[micro] = ids;
                         if (!last_rank) state.targets[micro] = Tensor();
                       })},
                      after, key);
      }
      NodeId input_node = read[m];
      if (j > 0) {
        const int peer = place.stage_of(j - 1);
        const int64_t tag = pipeline_message_tag(false, j - 1, micro, micro_batches);
        graph::NodeSpec spec{NodeKind::kRecv, str("recv activation ", j, " mb", m), m, StreamClass::kP2p, 0,
                             graph::task([&state, transport, device, peer, tag, micro, first] {
                               // A leaf: the chunk's backward stops here and hands its gradient back.
                               Tensor input = transport->receive(device, peer, tag);
                               input.set_requires_grad(true);
                               state.inputs[micro][first] = input;
                             })};
        spec.peer = peer;
        spec.tag = tag;
        spec.blocks_host = true;  // an MPI wait for the peer: off the CUDA executor's issuing thread
        input_node = add(std::move(spec), {}, receive_key(k));
      }
      for (int s = first; s < end; ++s) {
        std::vector<NodeId> dependencies{s == first ? input_node : forward[m][s - 1]};
        if (s + 1 == segments && read[m] >= 0) dependencies.push_back(read[m]);  // the targets
        if (!gathers.empty()) {
          for (size_t bucket : step.gathers->segment_buckets[s]) dependencies.push_back(gathers[bucket]);
        }
        // The stage's first forward starts the step: it zeroes the loss (which only the forward of
        // the last segment adds to, later on the same compute list) and is where WEFT_FAULT's
        // forward phase strikes.
        const bool step_start = first_forward;
        first_forward = false;
        forward[m][s] = add(
            {NodeKind::kForward, str("forward ", step.segments[s].name, " mb", m), m, StreamClass::kCompute, 0,
             graph::task([&state, run = step.segments[s].forward, loss_of = step.loss, s, first, j, micro, micro_batches,
                          segments, step_start, fault = step_start ? step.fault : std::nullopt,
                          loss_fault = s + 1 == segments && micro == 0 ? step.fault : std::nullopt,
                          rank = step.world_rank] {
               if (fault) fault->at(rank, state.step, FaultInjection::Phase::kForward);
               if (step_start) state.loss_sum.zero_();
               Tensor input;
               if (s > first) {
                 input = state.outputs[micro][s - 1].detach();
                 input.set_requires_grad(true);
                 state.inputs[micro][s] = input;
               } else if (j == 0) {
                 input = state.token_inputs[micro];
                 state.token_inputs[micro] = Tensor();
               } else {
                 input = state.inputs[micro][s];
               }
               Tensor output = run(input);
               if (loss_fault && loss_fault->poisons_loss(rank, state.step)) {
                 output = output * std::numeric_limits<double>::quiet_NaN();
               }
               if (s + 1 == segments) output = add_micro_batch_loss(state, output, micro, micro_batches, loss_of);
               state.outputs[micro][s] = output;
             })},
            dependencies, key);
        last_action_node = forward[m][s];
      }
      if (j + 1 < virtual_stages) {
        const int peer = place.stage_of(j + 1);
        const int64_t tag = pipeline_message_tag(false, j, micro, micro_batches);
        graph::NodeSpec spec{NodeKind::kSend, str("send activation ", j, " mb", m), m, StreamClass::kCompute, 0,
                             graph::task([&state, transport, peer, tag, micro, last = end - 1] {
                               transport->post_send(state.outputs[micro][last], peer, tag);
                             })};
        spec.peer = peer;
        spec.tag = tag;
        spec.blocks_host = sends_block_host;
        last_send = add(std::move(spec), {forward[m][end - 1]}, key);
      }
      continue;
    }

    if (action.kind == PipelineAction::Kind::kBackwardWeight) {
      for (int s = end - 1; s >= first; --s) {
        std::vector<NodeId> dependencies{backward[m][s]};
        if (m > 0 && weight[m - 1][s] >= 0) dependencies.push_back(weight[m - 1][s]);  // accumulation order
        weight[m][s] = add(
            {NodeKind::kBackward, str("backward weight ", step.segments[s].name, " mb", m), m, StreamClass::kCompute, 0,
             [&state, reducer, s, micro, last_micro_batch](const graph::NodeContext& context) -> CompletionPtr {
               ReducerBracket bracket(reducer, s, last_micro_batch, context);
               state.last_micro_batch = last_micro_batch;
               autograd::NoGradGuard no_grad;
               state.deferred[micro][s].run();
               return nullptr;
             }},
            dependencies, key);
        last_action_node = weight[m][s];
        if (last_micro_batch && reducer != nullptr) reducer->segment_backward_added(graph, s, weight[m][s]);
      }
      continue;
    }

    // The backward (or, zero bubble, its input-gradient part) of the chunk.
    NodeId gradient_node = -1;
    if (j + 1 < virtual_stages) {
      const int peer = place.stage_of(j + 1);
      const int64_t tag = pipeline_message_tag(true, j, micro, micro_batches);
      graph::NodeSpec spec{NodeKind::kRecv, str("recv gradient ", j, " mb", m), m, StreamClass::kP2p, 0,
                           graph::task([&state, transport, device, peer, tag, micro, end] {
                             state.input_gradients[micro][end] = transport->receive(device, peer, tag);
                           })};
      spec.peer = peer;
      spec.tag = tag;
      spec.blocks_host = true;  // an MPI wait for the peer: off the CUDA executor's issuing thread
      gradient_node = add(std::move(spec), {}, receive_key(k));
    }
    const bool input_only = action.kind == PipelineAction::Kind::kBackwardInput;
    WEFT_CHECK(input_only == split_backward, "pipeline: the ", pipeline_schedule_name(recipe.schedule),
               " schedule gave a ", action_name(action));
    for (int s = end - 1; s >= first; --s) {
      std::vector<NodeId> dependencies{s + 1 == end ? forward[m][s] : backward[m][s + 1]};
      if (s + 1 == end && gradient_node >= 0) dependencies.push_back(gradient_node);
      if (m > 0 && backward[m - 1][s] >= 0) dependencies.push_back(backward[m - 1][s]);  // accumulation order
      const bool fault_here = last_micro_batch && s == lowest_segment;
      backward[m][s] = add(
          {NodeKind::kBackward, str(input_only ? "backward input " : "backward ", step.segments[s].name, " mb", m), m,
           StreamClass::kCompute, 0,
           [&state, reducer, s, micro, segments, last_micro_batch, input_only,
            fault = fault_here ? step.fault : std::nullopt, rank = step.world_rank](
               const graph::NodeContext& context) -> CompletionPtr {
             if (fault) fault->at(rank, state.step, FaultInjection::Phase::kBackward);
             state.last_micro_batch = last_micro_batch;
             if (input_only) {
               // The weight gradients wait for this segment's "backward weight" node; the reducer
               // hears of the gradients there.
               autograd::DeferWeightGradients defer(state.deferred[micro][s]);
               backward_segment(state, s, micro, segments);
             } else {
               ReducerBracket bracket(reducer, s, last_micro_batch, context);
               backward_segment(state, s, micro, segments);
             }
             return nullptr;
           }},
          dependencies, key);
      last_action_node = backward[m][s];
      if (!input_only && last_micro_batch && reducer != nullptr) reducer->segment_backward_added(graph, s, backward[m][s]);
    }
    if (j > 0) {
      const int peer = place.stage_of(j - 1);
      const int64_t tag = pipeline_message_tag(true, j - 1, micro, micro_batches);
      graph::NodeSpec spec{NodeKind::kSend, str("send gradient ", j, " mb", m), m, StreamClass::kCompute, 0,
                           graph::task([&state, transport, peer, tag, micro, first] {
                             transport->post_send(state.input_gradients[micro][first], peer, tag);
                             state.input_gradients[micro][first] = Tensor();
                           })};
      spec.peer = peer;
      spec.tag = tag;
      spec.blocks_host = sends_block_host;
      last_send = add(std::move(spec), {backward[m][first]}, key);
    }
  }
  WEFT_CHECK(last_action_node >= 0, "pipeline stage ", place.stage, " has no work");

  std::vector<NodeId> before_update;
  if (reducer != nullptr) {
    before_update = reducer->backward_finished(graph, last_action_node);
    // A shared gradient's exchange (the tied embedding's, between the first and the last stage)
    // waits on the host for the other stage. Posted after this stage's last send, it can never
    // hold back what the other stage waits for (on CUDA that wait holds the issuing thread).
    if (last_send >= 0) reducer->order_exchanges_after(graph, last_send);
  }
  if (step.average_loss) {
    before_update.push_back(add({NodeKind::kCollective, "all_reduce loss", -1, StreamClass::kDpComm,
                                 static_cast<int64_t>(state.loss_sum.element_size()), step.average_loss},
                                {last_action_node}, std::numeric_limits<double>::quiet_NaN()));
  }
  // The update waits for everything else (every sink of the graph so far).
  for (const graph::Node& node : graph.nodes()) {
    if (node.dependents.empty() && !node.is_signal()) before_update.push_back(node.id);
  }
  const NodeId update = add({NodeKind::kOptimizer, "optimizer", -1, StreamClass::kCompute, 0,
                             graph::task([&state, update = step.update, fault = step.fault, rank = step.world_rank] {
                               if (fault) fault->at(rank, state.step, FaultInjection::Phase::kOptimizer);
                               update(state);
                             })},
                            before_update, std::numeric_limits<double>::quiet_NaN());
  if (step.gathers != nullptr && !step.gathers->before_forward) add_parameter_gathers(graph, *step.gathers, {update});

  // Nodes added without a key (the reducer's, the gathers, the step-wide ones) go right after
  // what they depend on.
  keys.resize(graph.size(), std::numeric_limits<double>::quiet_NaN());
  for (const graph::Node& node : graph.nodes()) {
    if (!std::isnan(keys[node.id])) continue;
    double key = -1.0;
    for (NodeId dependency : node.dependencies) key = std::max(key, keys[dependency]);
    keys[node.id] = key;
  }
  out.ordering = ordering_by_key(std::move(keys));
  return out;
}

}  // namespace weft
