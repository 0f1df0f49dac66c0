#include "parallel/pipeline/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "runtime/error.h"

namespace weft {

namespace {

using Kind = PipelineAction::Kind;

constexpr PipelineSchedule kAllSchedules[] = {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward,
                                              PipelineSchedule::kInterleaved, PipelineSchedule::kZeroBubble};

PipelineAction action(Kind kind, int micro_batch, int chunk = 0) { return {kind, micro_batch, chunk}; }

std::vector<PipelineAction> gpipe_actions(const PipelineShape& shape) {
  std::vector<PipelineAction> actions;
  for (int micro_batch = 0; micro_batch < shape.micro_batches; ++micro_batch) {
    actions.push_back(action(Kind::kForward, micro_batch));
  }
  for (int micro_batch = 0; micro_batch < shape.micro_batches; ++micro_batch) {
    actions.push_back(action(Kind::kBackward, micro_batch));
  }
  return actions;
}

std::vector<PipelineAction> one_forward_one_backward_actions(int stage, const PipelineShape& shape) {
  const int micro_batches = shape.micro_batches;
  // The warm-up fills the pipeline: the last stage starts its first backward right after its first
  // forward, and each stage before it runs one more forward while that backward travels back.
  const int warmup = std::min(shape.stages - stage - 1, micro_batches);
  std::vector<PipelineAction> actions;
  for (int micro_batch = 0; micro_batch < warmup; ++micro_batch) actions.push_back(action(Kind::kForward, micro_batch));
  for (int pair = 0; pair < micro_batches - warmup; ++pair) {
    actions.push_back(action(Kind::kForward, warmup + pair));
    actions.push_back(action(Kind::kBackward, pair));
  }
  for (int micro_batch = micro_batches - warmup; micro_batch < micro_batches; ++micro_batch) {
    actions.push_back(action(Kind::kBackward, micro_batch));
  }
  return actions;
}

std::vector<PipelineAction> interleaved_actions(int stage, const PipelineShape& shape) {
  const int stages = shape.stages;
  const int chunks = shape.chunks;
  const int total = shape.micro_batches * chunks;
  // Megatron's order: `stages` micro-batches through chunk 0, the same ones through chunk 1, ...,
  // then the next group of `stages` micro-batches; backwards walk the chunks in reverse.
  auto micro_batch_of = [&](int k) { return (k / (stages * chunks)) * stages + k % stages; };
  auto forward = [&](int k) { return action(Kind::kForward, micro_batch_of(k), (k / stages) % chunks); };
  auto backward = [&](int k) { return action(Kind::kBackward, micro_batch_of(k), chunks - 1 - (k / stages) % chunks); };
  // Enough forwards that the first backward (micro-batch 0 of the last chunk) can reach this stage.
  const int warmup = std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  std::vector<PipelineAction> actions;
  for (int k = 0; k < warmup; ++k) actions.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(forward(warmup + k));
    actions.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) actions.push_back(backward(k));
  return actions;
}

// ZB-H1: 1f1b with each backward split into its input pass (where 1f1b's backward was) and its weight
// pass. In the cool-down, 1f1b's stage s waits between backwards for the input gradients of the
// last micro-batches to travel back, s stages' worth; holding back its first s weight passes lets
// it spend that wait on them instead. Holding back more would only keep activations longer.
std::vector<PipelineAction> zero_bubble_actions(int stage, const PipelineShape& shape) {
  const int micro_batches = shape.micro_batches;
  const int warmup = std::min(shape.stages - stage - 1, micro_batches);
  const int held_back = stage;
  std::vector<PipelineAction> actions;
  int inputs_done = 0;
  int weights_done = 0;
  auto input_then_weight = [&](int micro_batch) {
    actions.push_back(action(Kind::kBackwardInput, micro_batch));
    ++inputs_done;
    if (inputs_done > held_back) actions.push_back(action(Kind::kBackwardWeight, weights_done++));
  };
  for (int micro_batch = 0; micro_batch < warmup; ++micro_batch) actions.push_back(action(Kind::kForward, micro_batch));
  for (int pair = 0; pair < micro_batches - warmup; ++pair) {
    actions.push_back(action(Kind::kForward, warmup + pair));
    input_then_weight(pair);
  }
  for (int micro_batch = micro_batches - warmup; micro_batch < micro_batches; ++micro_batch) {
    input_then_weight(micro_batch);
  }
  while (weights_done < micro_batches) actions.push_back(action(Kind::kBackwardWeight, weights_done++));
  return actions;
}

void check_durations(const PipelineDurations& durations) {
  for (auto [name, value] :
       {std::pair{"forward", durations.forward}, std::pair{"backward_input", durations.backward_input},
        std::pair{"backward_weight", durations.backward_weight}, std::pair{"transfer", durations.transfer}}) {
    WEFT_CHECK(std::isfinite(value) && value >= 0, "pipeline durations: ", name, " = ", value,
               " must be a finite number >= 0");
  }
}

double duration_of(Kind kind, const PipelineDurations& durations) {
  switch (kind) {
    case Kind::kForward: return durations.forward;
    case Kind::kBackward: return durations.backward_input + durations.backward_weight;
    case Kind::kBackwardInput: return durations.backward_input;
    case Kind::kBackwardWeight: return durations.backward_weight;
  }
  return 0.0;
}

// The bookkeeping of one simulation: when each piece of each (micro-batch, virtual stage) finished.
class PipelineTimes {
 public:
  static constexpr double kNotYet = -1.0;  // every real time is >= 0

  explicit PipelineTimes(const PipelineShape& shape)
      : shape_(shape),
        virtual_stages_(shape.stages * shape.chunks),
        forward_end_(static_cast<size_t>(shape.micro_batches) * virtual_stages_, kNotYet),
        input_gradient_end_(forward_end_.size(), kNotYet) {}

  int virtual_stages() const { return virtual_stages_; }
  int virtual_stage(int stage, const PipelineAction& action) const { return action.chunk * shape_.stages + stage; }
  double& forward_end(int micro_batch, int virtual_stage) { return forward_end_[index(micro_batch, virtual_stage)]; }
  // Set by kBackward or kBackwardInput: what the previous virtual stage waits for.
  double& input_gradient_end(int micro_batch, int virtual_stage) {
    return input_gradient_end_[index(micro_batch, virtual_stage)];
  }

 private:
  size_t index(int micro_batch, int virtual_stage) const {
    return static_cast<size_t>(micro_batch) * virtual_stages_ + virtual_stage;
  }

  PipelineShape shape_;
  int virtual_stages_;
  std::vector<double> forward_end_;         // (micro_batches, virtual_stages)
  std::vector<double> input_gradient_end_;  // (micro_batches, virtual_stages)
};

// What an action waits for: a piece of work of one (micro-batch, virtual stage).
struct Dependency {
  enum class Piece : uint8_t { kForward, kInputGradient };
  Piece piece;
  int micro_batch;
  int virtual_stage;
};

// The action's dependencies, in the order the description of a deadlock names the first missing one.
std::vector<Dependency> dependencies_of(const PipelineAction& action, int virtual_stage, int virtual_stages) {
  using Piece = Dependency::Piece;
  const int micro_batch = action.micro_batch;
  switch (action.kind) {
    case Kind::kForward:
      if (virtual_stage == 0) return {};
      return {{Piece::kForward, micro_batch, virtual_stage - 1}};
    case Kind::kBackward:
    case Kind::kBackwardInput:
      if (virtual_stage == virtual_stages - 1) return {{Piece::kForward, micro_batch, virtual_stage}};
      return {{Piece::kForward, micro_batch, virtual_stage}, {Piece::kInputGradient, micro_batch, virtual_stage + 1}};
    case Kind::kBackwardWeight: return {{Piece::kInputGradient, micro_batch, virtual_stage}};
  }
  return {};
}

// Throws unless every action is inside the shape and each piece of work is listed at most once per
// stage: the forward, the input gradient (B or I) and the weight gradient (B or W).
void check_action_lists(const std::vector<std::vector<PipelineAction>>& actions, const PipelineShape& shape) {
  WEFT_CHECK(shape.stages >= 1 && shape.chunks >= 1 && shape.micro_batches >= 1, "simulate_pipeline: shape of ",
             shape.stages, " stages, ", shape.micro_batches, " micro-batches and ", shape.chunks,
             " chunks; each must be at least 1");
  WEFT_CHECK(static_cast<int>(actions.size()) == shape.stages, "simulate_pipeline: ", actions.size(),
             " action lists for ", shape.stages, " stages; give one list per stage");
  const size_t pieces = static_cast<size_t>(shape.micro_batches) * shape.chunks;
  for (int stage = 0; stage < shape.stages; ++stage) {
    // The action that first listed each piece, to name both when one is listed again.
    std::vector<std::optional<PipelineAction>> forward(pieces), input_gradient(pieces), weight_gradient(pieces);
    for (const PipelineAction& action : actions[stage]) {
      WEFT_CHECK(action.micro_batch >= 0 && action.micro_batch < shape.micro_batches && action.chunk >= 0 &&
                     action.chunk < shape.chunks,
                 "simulate_pipeline: stage ", stage, " lists ", action_name(action), " (micro-batch ",
                 action.micro_batch, ", chunk ", action.chunk, "), outside the shape of ", shape.micro_batches,
                 " micro-batches and ", shape.chunks, " chunks");
      const size_t piece = static_cast<size_t>(action.micro_batch) * shape.chunks + action.chunk;
      auto claim = [&](std::vector<std::optional<PipelineAction>>& first, const char* what) {
        WEFT_CHECK(!first[piece], "simulate_pipeline: stage ", stage, " lists ", action_name(action), " after ",
                   action_name(*first[piece]), ", so it would compute the ", what, " of micro-batch ",
                   action.micro_batch, " chunk ", action.chunk, " twice; list each piece of work once");
        first[piece] = action;
      };
      if (action.kind == Kind::kForward) claim(forward, "forward");
      const bool whole_backward = action.kind == Kind::kBackward;
      if (whole_backward || action.kind == Kind::kBackwardInput) claim(input_gradient, "input gradient");
      if (whole_backward || action.kind == Kind::kBackwardWeight) claim(weight_gradient, "weight gradient");
    }
  }
}

// "stage 1 waits at B0 (action 3 of 8) for B0.c1 of stage 0, which stage 0 has not reached: it waits
// at F2 (action 2 of 8)".
std::string describe_wait(const std::vector<std::vector<PipelineAction>>& actions, const std::vector<size_t>& next,
                          int stage, const Dependency& missing, const PipelineShape& shape) {
  const PipelineAction& blocked = actions[stage][next[stage]];
  auto position = [&](int of_stage, size_t index) {
    return str("action ", index + 1, " of ", actions[of_stage].size());
  };
  const int owner = missing.virtual_stage % shape.stages;
  const int chunk = missing.virtual_stage / shape.stages;
  // Where the owner lists the missing piece (B and I both give an input gradient).
  auto provides = [&](const PipelineAction& action) {
    if (action.micro_batch != missing.micro_batch || action.chunk != chunk) return false;
    if (missing.piece == Dependency::Piece::kForward) return action.kind == Kind::kForward;
    return action.kind == Kind::kBackward || action.kind == Kind::kBackwardInput;
  };
  const std::vector<PipelineAction>& owner_actions = actions[owner];
  const auto found = std::find_if(owner_actions.begin(), owner_actions.end(), provides);
  std::string missing_name;
  if (found != owner_actions.end()) {
    missing_name = action_name(*found);
  } else if (missing.piece == Dependency::Piece::kForward) {
    missing_name = action_name(action(Kind::kForward, missing.micro_batch, chunk));
  } else {
    missing_name = str(action_name(action(Kind::kBackward, missing.micro_batch, chunk)), " or ",
                       action_name(action(Kind::kBackwardInput, missing.micro_batch, chunk)));
  }
  std::string text = str("stage ", stage, " waits at ", action_name(blocked), " (", position(stage, next[stage]),
                         ") for ", missing_name, " of stage ", owner, ", which ");
  if (found == owner_actions.end()) return text + str("stage ", owner, " never runs (it is not in its list)");
  const size_t found_index = static_cast<size_t>(found - owner_actions.begin());
  if (owner == stage) return text + str("comes later in its own list (", position(owner, found_index), ")");
  return text + str("stage ", owner, " has not reached (", position(owner, found_index), "): it waits at ",
                    action_name(owner_actions[next[owner]]), " (", position(owner, next[owner]), ")");
}

}  // namespace

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGpipe: return "gpipe";
    case PipelineSchedule::kOneForwardOneBackward: return "1f1b";
    case PipelineSchedule::kInterleaved: return "interleaved";
    case PipelineSchedule::kZeroBubble: return "zero_bubble";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(std::string_view text) {
  for (PipelineSchedule schedule : kAllSchedules) {
    if (text == pipeline_schedule_name(schedule)) return schedule;
  }
  WEFT_FAIL("parallel.pp_schedule: unknown schedule '", text, "'; choose one of gpipe, 1f1b, interleaved, zero_bubble");
}

std::string action_name(const PipelineAction& action) {
  const char* letter = "F";
  switch (action.kind) {
    case Kind::kForward: letter = "F"; break;
    case Kind::kBackward: letter = "B"; break;
    case Kind::kBackwardInput: letter = "I"; break;
    case Kind::kBackwardWeight: letter = "W"; break;
  }
  return action.chunk == 0 ? str(letter, action.micro_batch) : str(letter, action.micro_batch, ".c", action.chunk);
}

void check_pipeline_shape(PipelineSchedule schedule, const PipelineShape& shape) {
  WEFT_CHECK(shape.stages >= 1, "parallel.pp = ", shape.stages,
             ": a pipeline has at least 1 stage; set parallel.pp to 1 or more");
  WEFT_CHECK(shape.chunks >= 1, "parallel.pp_virtual = ", shape.chunks,
             ": every rank holds at least 1 model chunk; set parallel.pp_virtual to 1 (2 or more with "
             "parallel.pp_schedule interleaved)");
  WEFT_CHECK(shape.micro_batches >= shape.stages, "train.micro_batches = ", shape.micro_batches,
             " is less than parallel.pp = ", shape.stages,
             ": a pipeline needs at least one micro-batch per stage; set train.micro_batches to ", shape.stages,
             " or more");
  const char* name = pipeline_schedule_name(schedule);
  if (schedule == PipelineSchedule::kInterleaved) {
    WEFT_CHECK(shape.chunks >= 2, "parallel.pp_virtual = ", shape.chunks, " with parallel.pp_schedule = ", name,
               ": the interleaved schedule runs 2 or more model chunks per rank; set parallel.pp_virtual to 2 or "
               "more, or parallel.pp_schedule to 1f1b");
    const int below = shape.micro_batches / shape.stages * shape.stages;
    WEFT_CHECK(shape.micro_batches % shape.stages == 0, "train.micro_batches = ", shape.micro_batches,
               " is not a multiple of parallel.pp = ", shape.stages,
               ": Megatron's interleaved schedule (parallel.pp_schedule = ", name,
               ") takes micro-batches in groups of one per stage; set train.micro_batches to ", below, " or ",
               below + shape.stages);
  } else {
    WEFT_CHECK(shape.chunks == 1, "parallel.pp_virtual = ", shape.chunks,
               " applies to the interleaved schedule only, and parallel.pp_schedule = ", name,
               "; set parallel.pp_virtual to 1, or parallel.pp_schedule to interleaved");
  }
}

std::vector<std::vector<PipelineAction>> pipeline_actions(PipelineSchedule schedule, const PipelineShape& shape) {
  check_pipeline_shape(schedule, shape);
  std::vector<std::vector<PipelineAction>> actions(shape.stages);
  for (int stage = 0; stage < shape.stages; ++stage) {
    switch (schedule) {
      case PipelineSchedule::kGpipe: actions[stage] = gpipe_actions(shape); break;
      case PipelineSchedule::kOneForwardOneBackward:
        actions[stage] = one_forward_one_backward_actions(stage, shape);
        break;
      case PipelineSchedule::kInterleaved: actions[stage] = interleaved_actions(stage, shape); break;
      case PipelineSchedule::kZeroBubble: actions[stage] = zero_bubble_actions(stage, shape); break;
    }
  }
  return actions;
}

double theoretical_bubble(PipelineSchedule schedule, const PipelineShape& shape, const PipelineDurations& durations) {
  check_pipeline_shape(schedule, shape);
  check_durations(durations);
  const double stages = shape.stages;
  const double micro_batches = shape.micro_batches;
  switch (schedule) {
    case PipelineSchedule::kGpipe:
    case PipelineSchedule::kOneForwardOneBackward:
      // (p-1)(F+B+W) / (m(F+B+W) + (p-1)(F+B+W)): the durations cancel.
      return (stages - 1) / (micro_batches + stages - 1);
    case PipelineSchedule::kInterleaved: return (stages - 1) / (shape.chunks * micro_batches + stages - 1);
    case PipelineSchedule::kZeroBubble: {
      const double forward = durations.forward;
      const double input = durations.backward_input;
      const double weight = durations.backward_weight;
      const double idle = (stages - 1) * std::max(0.0, forward + input - weight);
      const double total = micro_batches * (forward + input + weight) + idle;
      return total > 0 ? idle / total : 0.0;
    }
  }
  return 0.0;
}

PipelineSimulation simulate_pipeline(const std::vector<std::vector<PipelineAction>>& actions,
                                     const PipelineShape& shape, const PipelineDurations& durations) {
  check_action_lists(actions, shape);
  check_durations(durations);
  const int stages = shape.stages;
  PipelineTimes times(shape);
  const int virtual_stages = times.virtual_stages();
  auto end_of = [&](const Dependency& dependency) -> double& {
    return dependency.piece == Dependency::Piece::kForward
               ? times.forward_end(dependency.micro_batch, dependency.virtual_stage)
               : times.input_gradient_end(dependency.micro_batch, dependency.virtual_stage);
  };

  PipelineSimulation simulation;
  simulation.stage_busy.assign(stages, 0.0);
  simulation.action_start.resize(stages);
  std::vector<size_t> next(stages, 0);       // the position of each stage's next action
  std::vector<double> free_at(stages, 0.0);  // when each stage finishes its last action so far
  // When each stage's last message so far has arrived: a stage receives one at a time, in the
  // order its actions need them (one p2p stream or thread receives them all).
  std::vector<double> received_at(stages, 0.0);

  // Every start time depends only on finish times that are fixed once known, so sweeping the stages
  // until none can advance gives the same times in any sweep order.
  bool advanced = true;
  while (advanced) {
    advanced = false;
    for (int stage = 0; stage < stages; ++stage) {
      while (next[stage] < actions[stage].size()) {
        const PipelineAction& action = actions[stage][next[stage]];
        const int virtual_stage = times.virtual_stage(stage, action);
        double start = free_at[stage];
        double arrival = -1.0;  // when this action's message arrives, if it needs one
        bool ready = true;
        for (const Dependency& dependency : dependencies_of(action, virtual_stage, virtual_stages)) {
          const double end = end_of(dependency);
          if (end == PipelineTimes::kNotYet) {
            ready = false;
            break;
          }
          if (dependency.virtual_stage % stages != stage) {
            // The transfer starts once the data exists and the stage's previous message is in.
            arrival = std::max(end, received_at[stage]) + durations.transfer;
            start = std::max(start, arrival);
          } else {
            start = std::max(start, end);
          }
        }
        if (!ready) break;
        if (arrival >= 0.0) received_at[stage] = arrival;
        const double end = start + duration_of(action.kind, durations);
        if (action.kind == Kind::kForward) times.forward_end(action.micro_batch, virtual_stage) = end;
        if (action.kind == Kind::kBackward || action.kind == Kind::kBackwardInput) {
          times.input_gradient_end(action.micro_batch, virtual_stage) = end;
        }
        simulation.action_start[stage].push_back(start);
        simulation.stage_busy[stage] += duration_of(action.kind, durations);
        simulation.makespan = std::max(simulation.makespan, end);
        free_at[stage] = end;
        ++next[stage];
        advanced = true;
      }
    }
  }

  std::vector<std::string> waits;
  for (int stage = 0; stage < stages; ++stage) {
    if (next[stage] == actions[stage].size()) continue;
    const PipelineAction& blocked = actions[stage][next[stage]];
    for (const Dependency& dependency : dependencies_of(blocked, times.virtual_stage(stage, blocked), virtual_stages)) {
      if (end_of(dependency) == PipelineTimes::kNotYet) {
        waits.push_back(describe_wait(actions, next, stage, dependency, shape));
        break;
      }
    }
  }
  simulation.deadlock = !waits.empty();
  for (size_t i = 0; i < waits.size(); ++i) simulation.deadlock_description += (i == 0 ? "" : "; ") + waits[i];

  simulation.stage_idle.resize(stages);
  for (int stage = 0; stage < stages; ++stage) {
    simulation.stage_idle[stage] = simulation.makespan - simulation.stage_busy[stage];
    if (simulation.makespan > 0) simulation.bubble += simulation.stage_idle[stage] / simulation.makespan / stages;
  }

  simulation.peak_in_flight.assign(stages, 0);
  for (int stage = 0; stage < stages; ++stage) {
    int in_flight = 0;
    for (const PipelineAction& action : actions[stage]) {
      if (action.kind == Kind::kForward) ++in_flight;
      if (action.kind == Kind::kBackward || action.kind == Kind::kBackwardInput) --in_flight;
      simulation.peak_in_flight[stage] = std::max(simulation.peak_in_flight[stage], in_flight);
    }
  }
  return simulation;
}

}  // namespace weft
