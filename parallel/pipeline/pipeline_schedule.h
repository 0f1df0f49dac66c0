// Pipeline-parallel schedules as per-stage action lists, and a simulator that times them.
//
// A schedule says, for each pipeline stage (rank of the pp group), the order in which it runs the
// forward and backward passes of every micro-batch of every model chunk it holds:
//
//   pipeline_actions(PipelineSchedule::kOneForwardOneBackward, {.stages = 3, .micro_batches = 4})
//     stage 0: F0 F1 F2 B0 F3 B1 B2 B3
//     stage 1: F0 F1 B0 F2 B1 F3 B2 B3
//     stage 2: F0 B0 F1 B1 F2 B2 F3 B3
//
// Invariants of every list pipeline_actions returns: each (micro-batch, chunk) of each stage appears
// once as kForward and either once as kBackward or (zero_bubble) once as kBackwardInput followed,
// later on the same stage, by once kBackwardWeight; the forwards of one chunk run in micro-batch
// order, and so do its backwards. Interleaved stages hold `chunks` model chunks each; chunk c of stage s is virtual stage
// c * stages + s, so data goes stage 0, 1, ..., stages-1, then back to stage 0's next chunk.
//
// simulate_pipeline runs a list against relative durations, with the dependencies of the data flow
// (a forward needs the previous virtual stage's forward, an input gradient needs the next virtual
// stage's). Sends never wait for their receiver (parallel/pipeline/pipeline_transport.h), so a list
// deadlocks only if a stage's next action waits on something that can never finish; the simulator
// reports that instead of throwing. The idle time it counts is the bubble of the papers: every stage
// starts the step at time 0 and the step ends when the last stage finishes (the optimizer step
// waits for all), so a stage's wait before its first action and after its last one is idle time.
// Without transfer latency the simulated bubble of gpipe, 1f1b and interleaved equals
// theoretical_bubble whatever the durations, and zero_bubble's equals its ZB-H1 formula whenever
// that formula applies (W <= F and W <= B, equal durations included).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

enum class PipelineSchedule : uint8_t { kGpipe, kOneForwardOneBackward, kInterleaved, kZeroBubble };
// "gpipe", "1f1b", "interleaved", "zero_bubble" (the YAML values of parallel.pp_schedule).
const char* pipeline_schedule_name(PipelineSchedule schedule);
// Parses those names; throws weft::Error naming parallel.pp_schedule and the four choices otherwise.
PipelineSchedule parse_pipeline_schedule(std::string_view text);

struct PipelineAction {
  // kBackward: the whole backward (input and weight gradients). Zero bubble splits it into
  // kBackwardInput (the input gradient, which the previous stage waits for) and kBackwardWeight.
  enum class Kind : uint8_t { kForward, kBackward, kBackwardInput, kBackwardWeight };
  Kind kind = Kind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // model chunk on this rank, 0..chunks-1; virtual stage = chunk * stages + stage
  bool operator==(const PipelineAction&) const = default;
};
// "F3" / "B3" / "I3" / "W3" (micro-batch 3), with ".c1" appended when chunk != 0: "F3.c1".
std::string action_name(const PipelineAction& action);

struct PipelineShape {
  int stages = 1;         // parallel.pp
  int micro_batches = 1;  // train.micro_batches
  int chunks = 1;         // parallel.pp_virtual (model chunks per rank; interleaved only)
};
// Throws weft::Error with a message naming the config keys and how to fix them unless:
//  - stages >= 1 and chunks >= 1;
//  - micro_batches >= stages (a pipeline needs at least one micro-batch per stage);
//  - interleaved: chunks >= 2 and micro_batches % stages == 0 (Megatron's interleaved schedule takes
//    micro-batches in groups of one per stage);
//  - the other schedules: chunks == 1.
void check_pipeline_shape(PipelineSchedule schedule, const PipelineShape& shape);

// The actions of every stage in execution order: result[stage]. Calls check_pipeline_shape.
//   gpipe: every forward, then every backward, both in micro-batch order.
//   1f1b: Megatron-LM's non-interleaved schedule: stage s runs min(stages - s - 1, m) warm-up
//     forwards, then forward-backward pairs, then the remaining backwards. Stage s keeps at most
//     stages - s micro-batches' activations.
//   interleaved: Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving):
//     the k-th forward runs chunk (k / stages) % chunks, the k-th backward chunk
//     chunks - 1 - (k / stages) % chunks, both of micro-batch (k / (stages * chunks)) * stages +
//     k % stages; (stages - s - 1) * 2 + (chunks - 1) * stages warm-up forwards (at most all of
//     them), then forward-backward pairs, then the remaining backwards.
//   zero_bubble: ZB-H1 (Qi et al., 2023): 1f1b's order with each backward split into kBackwardInput
//     in its place, followed by a kBackwardWeight, except that stage s holds back its first s weight
//     passes (each runs s input passes late) and runs the held-back ones at the end, where they fill
//     the time 1f1b's stage s spends waiting for the input gradients of the last micro-batches. The
//     activations in flight until the input gradient are 1f1b's (stages - s); until the weight
//     gradient, at most `stages` on every stage, 1f1b's peak on stage 0.
std::vector<std::vector<PipelineAction>> pipeline_actions(PipelineSchedule schedule, const PipelineShape& shape);

// Relative durations of the pieces of work (one micro-batch, one chunk).
struct PipelineDurations {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;  // kBackward takes backward_input + backward_weight
  double transfer = 0.0;         // latency of each send between two different stages
};

// The schedule's bubble fraction from the papers, idle / (busy + idle) per stage, with F, B, W the
// forward, backward-input and backward-weight durations (transfer is not counted):
//   gpipe, 1f1b: (p-1)(F+B+W) / (m(F+B+W) + (p-1)(F+B+W)) = (p-1)/(m+p-1);
//   interleaved (Narayanan et al. 2021): (p-1)/(v*m + p-1) with v = chunks;
//   zero_bubble ZB-H1 (Qi et al. 2023): (p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W)), which assumes the
//   weight pass is no longer than the forward and the input pass (W <= F, W <= B): a weight pass
//   must fit in each gap it fills. With a longer one the schedule leaves more bubble than this.
// Calls check_pipeline_shape.
double theoretical_bubble(PipelineSchedule schedule, const PipelineShape& shape,
                          const PipelineDurations& durations = {});

struct PipelineSimulation {
  bool deadlock = false;
  std::string deadlock_description;  // which actions of which stages wait for what, when deadlock
  double makespan = 0.0;             // end of the last action
  std::vector<double> stage_busy;    // per stage: sum of durations
  // Per stage: idle time within the step, [0, makespan] (see the top of this file): makespan - busy.
  std::vector<double> stage_idle;
  double bubble = 0.0;  // mean over stages of idle / (busy + idle)
  // Per stage: the most micro-batch-chunks forwarded but not yet backward-input'ed at once
  // (activations kept), counted along the stage's list.
  std::vector<int> peak_in_flight;
  // [stage][position in the stage's list]: when the action started; only the actions that ran, when
  // deadlock. With busy and makespan it draws the timeline.
  std::vector<std::vector<double>> action_start;
};

// Runs `actions` (as pipeline_actions returns them, one list per stage) with `durations`: each
// stage runs its actions one at a time in list order, each as soon as its dependencies are done:
//   F(m, virtual stage j) after F(m, j-1) finished (+ transfer), j > 0;
//   B or I (m, j) after F(m, j) on the same stage, and after B/I(m, j+1) finished (+ transfer) for
//   j < the last virtual stage;
//   W(m, j) after I(m, j).
// Virtual stage j runs on stage j % stages as chunk j / stages. Transfer is added only between two
// different stages (one stage passing from its chunk to its next, when stages == 1, sends nothing).
// A stage receives one message at a time, in the order its actions need them (weft posts a stage's
// receives on one p2p stream or thread): a transfer starts once its data exists and the stage's
// previous message has arrived, so transfers longer than the compute between them queue up.
// A stage whose next action can never start is a deadlock: reported, not thrown. Throws weft::Error
// for input that is no schedule at all: not one list per stage, a micro-batch or chunk out of the
// shape, an action listed twice, a negative duration.
PipelineSimulation simulate_pipeline(const std::vector<std::vector<PipelineAction>>& actions,
                                     const PipelineShape& shape, const PipelineDurations& durations = {});

}  // namespace weft
