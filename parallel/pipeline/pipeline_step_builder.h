// The step graph of one pipeline stage, and its schedule as an ordering of that graph.
//
// A model's segments (layers/model_segment.h) are cut into pp * chunks virtual stages of
// contiguous segments; virtual stage j runs on stage (rank) j % pp as its chunk j / pp. For M
// micro-batches a stage's graph holds, per micro-batch and chunk it runs:
//
//   read mb<m>                      the first and last virtual stages' ranks: the micro-batch from
//                                   the data (ids for the embedding, targets for the loss), in order
//   recv activation j mb<m>         (j > 0) the previous virtual stage's output, a leaf requiring grad
//   forward <segment> mb<m>         each segment of the chunk; the last segment adds the loss
//   send activation j mb<m>         (j < V - 1) the chunk's output to the next virtual stage
//   recv gradient j mb<m>           (j < V - 1) the gradient of that output
//   backward <segment> mb<m>        each segment, last first, from the received gradient (or the
//                                   loss) to the chunk's input
//   send gradient j mb<m>           (j > 0) the input's gradient to the previous virtual stage
//
// and then the data-parallel bucket collectives (the reducer's nodes, hung off the last
// micro-batch's backwards exactly as in the one-stage graph), the loss's all-reduce (the dp mean,
// then the sum over stages: only the last stage has a loss), and the optimizer.
//
// The zero-bubble schedule splits each backward into "backward input" (the input gradient, which
// the previous stage waits for; linear layers' weight-gradient matmuls are deferred, see
// runtime/autograd/deferred_weight_gradients.h) and "backward weight" (the deferred work, which
// finishes the weight gradients: the reducer hears of them there).
//
// Edges are data dependencies only (and the accumulation order of a segment's backwards across
// micro-batches); sends and receives carry their peer stage and tag (pipeline_message_tag) so that
// a test can match them across ranks without running anything. The schedule (GPipe, 1F1B,
// interleaved, zero bubble: parallel/pipeline/pipeline_schedule.h) is the ordering policy returned
// with the graph: the stage's actions in order, each action's nodes together.
//
// Streams. A send is posted on the compute stream right after the node that made its tensor: over
// the host route it never waits (PipelineTransport), so it costs compute a few microseconds, whereas
// on the p2p stream it would queue behind a blocking receive — and a receive that waits for a peer
// which waits for that send is a deadlock (the 1F1B steady state has exactly that pair on every
// boundary). Over the direct route (NCCL) a send waits for its receive on the compute stream; the
// auto mode's early receives on the p2p stream keep that live, and where such a send would wait on
// the host it is marked blocks_host. Receives run on the p2p stream (auto mode): with post_receives_early a receive is
// ordered before the action that precedes its own, so the p2p stream waits for the message while
// compute runs that action. In the manual mode everything is on the compute stream and each
// receive comes right where its data is needed, as hand-written code does it.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/pipeline/pipeline_transport.h"
#include "parallel/step/step_builder.h"
#include "runtime/graph/scheduler.h"

namespace weft {

// Which virtual stages this rank runs and where each virtual stage starts.
struct PipelinePlacement {
  int stage = 0;                    // this rank's pipeline coordinate
  int stages = 1;                   // parallel.pp
  int chunks = 1;                   // parallel.pp_virtual
  std::vector<int> first_segment;   // per virtual stage, its first segment; back() = segment count

  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int chunk) const { return chunk * stages + stage; }
  int stage_of(int virtual_stage) const { return virtual_stage % stages; }
  int virtual_stage_of_segment(int segment) const;
  bool holds(int segment) const { return stage_of(virtual_stage_of_segment(segment)) == stage; }
};

struct PipelineRecipe {
  StepRecipe step;                  // segments: all of the model's, by global index
  PipelinePlacement placement;
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  PipelineTransport* transport = nullptr;  // null: a graph to inspect only; its p2p nodes must not run
  bool post_receives_early = false;
};

struct PipelineStepGraph {
  graph::StepGraph graph;
  graph::OrderingPolicy ordering;         // the schedule over `graph`
  std::vector<PipelineAction> actions;    // this stage's, in order
};

// The tag of the message crossing virtual-stage boundary `boundary` (between virtual stages
// `boundary` and `boundary + 1`) for micro-batch `micro`: the activation, or its gradient.
int64_t pipeline_message_tag(bool gradient, int boundary, int64_t micro, int64_t micro_batches);

// Builds this stage's graph over `state` (kept by reference in the nodes, as build_step_graph).
PipelineStepGraph build_pipeline_step_graph(const PipelineRecipe& recipe, StepState& state);

}  // namespace weft
