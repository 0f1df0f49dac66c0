// StepBuilder: the graph of one optimizer step, built once per run over a reusable StepState.
//
// For M micro-batches and S model segments (layers/model_segment.h) the graph holds, in program
// order (the order the manual comm mode runs it in):
//
//   [gathers of the previous update]    ZeRO, auto mode: one all_gather per bucket, before the
//                                       forwards that read its parameters (dp_comm)
//   per micro-batch m:
//     forward <segment> mb<m>           s = 0..S-1; segment 0 reads the micro-batch; the last
//                                       computes the loss (/ M) and adds it to the step's loss sum
//     backward <segment> mb<m>          s = S-1..0: backward from the segment output's gradient to
//                                       its input, whose gradient the segment below starts from
//     (last micro-batch: the reducer's bucket collectives: in the auto mode each on a signal its
//      backward fires when the bucket's last gradient is in, in the manual mode all after backward;
//      the reducer hears of each finished gradient between backward_begins and backward_ends)
//   all_reduce loss                     the loss sum averaged over the dp group, on the device
//   optimizer                           the recipe's update: clips and updates on the device, the
//                                       update guarded by the loss being finite (no host read)
//   [gathers of this update]            ZeRO, manual mode: at the end of the step
//
// A segment's input is a detached leaf of the previous segment's output, so backward stops there
// (autograd::backward_to_inputs hands back its gradient without accumulating it): a pipeline
// stage's backward will be the same node on another rank. Edges are data dependencies only: the
// previous segment, the same segment of the previous micro-batch (gradient accumulation), the
// bucket gathers a forward reads. The scheduler and the comm mode decide the rest.
//
// No node reads anything back to the host: the micro-batch's targets are counted on the host before
// they are uploaded (so cross-entropy needs no read), the loss is summed and averaged on the device,
// and the update is guarded on the device. The caller reads the loss after the step (the executor
// has synchronized by then) and applies the NaN policy: stop, or undo the skipped step's counts.
//
// StepState is what the work of the nodes reads and writes; the caller fills its inputs before
// each execution and reads its results after. The graph and the state must outlive each other's
// use: the nodes hold a reference to the state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "layers/model_segment.h"
#include "parallel/data/reducer.h"
#include "parallel/step/micro_batch.h"
#include "parallel/step/fault_injection.h"
#include "parallel/step/weight_gradient_overlap.h"
#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/graph/step_graph.h"
#include "runtime/tensor.h"

namespace weft {

struct StepState {
  // Set by the caller before each step.
  MicroBatchSource next_micro_batch;
  double lr = 0.0;
  int64_t step = 0;
  // Written by the step, on the device: read them after it.
  Tensor grad_squares;               // squared norms of the gradients' parts (the recipe's update)
  // Between nodes: per micro-batch and segment, the segment's input leaf and output.
  std::vector<std::vector<Tensor>> inputs;
  std::vector<std::vector<Tensor>> outputs;
  std::vector<std::vector<Tensor>> input_gradients;  // what a segment's backward hands the one below
  std::vector<Tensor> targets;       // per micro-batch [B, T], on the device
  std::vector<int64_t> counted_targets;  // per micro-batch: targets cross-entropy counts
  Tensor loss_sum;                   // [1] accumulation dtype, on the device
  // While a backward runs: whether it is of the step's last micro-batch (its gradients are final
  // when it ends: tensor parallelism sums partial ones then).
  bool last_micro_batch = false;
  // Pipelines: per micro-batch, the ids a first stage's embedding reads (read before the forward
  // that needs them), and per micro-batch and segment the weight-gradient work a zero-bubble
  // schedule's input-gradient backward left for its weight-gradient node.
  std::vector<Tensor> token_inputs;
  std::vector<std::vector<autograd::DeferredWeightGradients>> deferred;
  // StepRecipe::overlap_weight_gradients: the second stream the weight gradients run on.
  std::shared_ptr<WeightGradientOverlap> weight_gradient_overlap;
};

// The loss of one micro-batch: logits [N, V] (or this rank's vocabulary part [N, V / tp]) against
// targets [N], of which `counted` are not ignored -> the mean, a scalar.
using LossFunction = std::function<Tensor(const Tensor& logits, const Tensor& targets, int64_t counted)>;

// Collectives that bring parameters up to date after a sharded update (ZeRO).
struct ParameterGathers {
  std::vector<int64_t> bytes;                      // per bucket
  std::vector<std::vector<size_t>> segment_buckets;  // per segment: the buckets its forward reads
  bool before_forward = false;                     // auto: at the next step's start; manual: at the end
  std::function<CompletionPtr(size_t bucket, const graph::NodeContext&)> gather;
};

struct StepRecipe {
  std::vector<ModelSegment> segments;
  int64_t micro_batches = 1;
  Device device;
  LossFunction loss;                               // null: cross_entropy
  Reducer* reducer = nullptr;                      // null: no bucket collectives (one rank)
  std::unique_ptr<ParameterGathers> gathers;       // null: no ZeRO
  // Averages state.loss_sum over the dp group; null with one rank.
  std::function<CompletionPtr(const graph::NodeContext&)> average_loss;
  // The update, on the compute stream: state.loss_sum is the loss to guard it with.
  std::function<void(StepState&)> update;
  // Tests: WEFT_FAULT's point (fault_injection.h), checked in the first forward, the last backward
  // and the optimizer node of this rank.
  std::optional<FaultInjection> fault;
  int world_rank = 0;
  // Each segment's weight-gradient products on a second stream, beside the next segment's backward
  // (weight_gradient_overlap.h). Only for a recipe without a reducer, whose gradients no grad-ready
  // hook waits for on the compute stream; the caller checks that no collective reads them either.
  bool overlap_weight_gradients = false;
};

// The pieces of a segment's work that the pipeline builder (parallel/pipeline/) shares:
//
// Reads micro-batch `micro` from state.next_micro_batch, counts its targets on the host, keeps them
// on `device` in state.targets and returns the ids on `device`.
Tensor load_micro_batch(StepState& state, int64_t micro, Device device);
// The loss of micro-batch `micro` from the last segment's `output` (logits), divided by the number
// of micro-batches and added to state.loss_sum: the tensor the last segment's backward starts from.
Tensor add_micro_batch_loss(StepState& state, const Tensor& output, int64_t micro, int64_t micro_batches,
                            const LossFunction& loss_of);
// The backward of segment `s` (of `segments`) for `micro`: from the gradient of its output (the
// loss, or state.input_gradients[micro][s + 1]) to its input leaf, whose gradient it leaves in
// state.input_gradients[micro][s]; frees what it used.
void backward_segment(StepState& state, int s, int64_t micro, int segments);
// The gather nodes of every bucket, in forward order (the last bucket holds the first segment's
// parameters), each after `after` (none at the step's start).
std::vector<graph::NodeId> add_parameter_gathers(graph::StepGraph& graph, const ParameterGathers& gathers,
                                                 const std::vector<graph::NodeId>& after);
// Tells `reducer` (may be null) that the backward of `segment` runs for as long as it lives.
class ReducerBracket {
 public:
  ReducerBracket(Reducer* reducer, int segment, bool last_micro_batch, const graph::NodeContext& context)
      : reducer_(reducer) {
    if (reducer_ != nullptr) reducer_->backward_begins(segment, last_micro_batch, context);
  }
  ~ReducerBracket() {
    if (reducer_ != nullptr) reducer_->backward_ends();
  }
  ReducerBracket(const ReducerBracket&) = delete;
  ReducerBracket& operator=(const ReducerBracket&) = delete;

 private:
  Reducer* reducer_;
};

// Builds the step's graph over `state` (which the nodes keep a reference to; they copy what they
// need of `recipe`, and the reducer's nodes copy its work, so the recipe may go).
graph::StepGraph build_step_graph(const StepRecipe& recipe, StepState& state);

}  // namespace weft
