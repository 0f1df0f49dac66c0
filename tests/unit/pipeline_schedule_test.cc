// Pipeline schedules (parallel/pipeline/pipeline_schedule.h): the exact action lists of small cases,
// the invariants of every list over many shapes, the simulator's bubble against the papers' formulas,
// deadlock detection and the configuration errors. Pure: no MPI, no devices.
#include "parallel/pipeline/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "runtime/error.h"

namespace weft {
namespace {

using Kind = PipelineAction::Kind;

constexpr PipelineSchedule kAllSchedules[] = {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward,
                                              PipelineSchedule::kInterleaved, PipelineSchedule::kZeroBubble};

// "F0 F1 B0 B1": one stage's list, as the expectations below are written.
std::string joined_names(const std::vector<PipelineAction>& actions) {
  std::string text;
  for (const PipelineAction& action : actions) text += (text.empty() ? "" : " ") + action_name(action);
  return text;
}

std::vector<std::string> stage_names(PipelineSchedule schedule, const PipelineShape& shape) {
  std::vector<std::string> names;
  for (const std::vector<PipelineAction>& stage : pipeline_actions(schedule, shape)) {
    names.push_back(joined_names(stage));
  }
  return names;
}

// The shapes each schedule is checked on: stages 1..8, micro-batches stages..4*stages (interleaved:
// the multiples of stages, with 2..4 chunks).
std::vector<PipelineShape> shapes_of(PipelineSchedule schedule) {
  std::vector<PipelineShape> shapes;
  for (int stages = 1; stages <= 8; ++stages) {
    for (int micro_batches = stages; micro_batches <= 4 * stages; ++micro_batches) {
      if (schedule != PipelineSchedule::kInterleaved) {
        shapes.push_back({stages, micro_batches, 1});
      } else if (micro_batches % stages == 0) {
        for (int chunks = 2; chunks <= 4; ++chunks) shapes.push_back({stages, micro_batches, chunks});
      }
    }
  }
  return shapes;
}

std::string describe(PipelineSchedule schedule, const PipelineShape& shape) {
  return str(pipeline_schedule_name(schedule), " stages=", shape.stages, " micro_batches=", shape.micro_batches,
             " chunks=", shape.chunks);
}

// The message weft::Error carries, or "" when `call` does not throw.
template <class Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(PipelineScheduleTest, NamesRoundTripAndUnknownNamesListTheChoices) {
  for (PipelineSchedule schedule : kAllSchedules) {
    EXPECT_EQ(parse_pipeline_schedule(pipeline_schedule_name(schedule)), schedule);
  }
  EXPECT_STREQ(pipeline_schedule_name(PipelineSchedule::kOneForwardOneBackward), "1f1b");
  EXPECT_STREQ(pipeline_schedule_name(PipelineSchedule::kZeroBubble), "zero_bubble");
  const std::string message = error_of([] { parse_pipeline_schedule("1F1B"); });
  EXPECT_NE(message.find("parallel.pp_schedule"), std::string::npos) << message;
  for (const char* choice : {"gpipe", "1f1b", "interleaved", "zero_bubble", "'1F1B'"}) {
    EXPECT_NE(message.find(choice), std::string::npos) << message;
  }
}

TEST(PipelineScheduleTest, ActionNames) {
  EXPECT_EQ(action_name({Kind::kForward, 3, 0}), "F3");
  EXPECT_EQ(action_name({Kind::kBackward, 3, 0}), "B3");
  EXPECT_EQ(action_name({Kind::kBackwardInput, 12, 0}), "I12");
  EXPECT_EQ(action_name({Kind::kBackwardWeight, 0, 0}), "W0");
  EXPECT_EQ(action_name({Kind::kForward, 3, 1}), "F3.c1");
}

// The expected lists below are written from the schedules' definitions, not from the code's output.
TEST(PipelineScheduleTest, GpipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(stage_names(PipelineSchedule::kGpipe, {.stages = 2, .micro_batches = 3}),
            (std::vector<std::string>{"F0 F1 F2 B0 B1 B2", "F0 F1 F2 B0 B1 B2"}));
}

TEST(PipelineScheduleTest, OneForwardOneBackwardAtThreeStagesFourMicroBatches) {
  // Stage s: stages - s - 1 warm-up forwards, forward-backward pairs, the remaining backwards.
  EXPECT_EQ(stage_names(PipelineSchedule::kOneForwardOneBackward, {.stages = 3, .micro_batches = 4}),
            (std::vector<std::string>{
                "F0 F1 F2 B0 F3 B1 B2 B3",
                "F0 F1 B0 F2 B1 F3 B2 B3",
                "F0 B0 F1 B1 F2 B2 F3 B3",
            }));
}

TEST(PipelineScheduleTest, InterleavedAtTwoStagesFourMicroBatchesTwoChunks) {
  // Forward k runs micro-batch (k / 4) * 2 + k % 2 on chunk (k / 2) % 2: F0 F1 F0.c1 F1.c1 F2 F3 F2.c1
  // F3.c1; backward k the same micro-batch on chunk 1 - (k / 2) % 2. Warm-up: (2 - s - 1) * 2 + 2.
  EXPECT_EQ(stage_names(PipelineSchedule::kInterleaved, {.stages = 2, .micro_batches = 4, .chunks = 2}),
            (std::vector<std::string>{
                "F0 F1 F0.c1 F1.c1 F2 B0.c1 F3 B1.c1 F2.c1 B0 F3.c1 B1 B2.c1 B3.c1 B2 B3",
                "F0 F1 F0.c1 B0.c1 F1.c1 B1.c1 F2 B0 F3 B1 F2.c1 B2.c1 F3.c1 B3.c1 B2 B3",
            }));
}

TEST(PipelineScheduleTest, ZeroBubbleAtThreeStagesFourMicroBatches) {
  // 1f1b's order with I in place of B; stage s holds back its first s weight passes to the end.
  EXPECT_EQ(stage_names(PipelineSchedule::kZeroBubble, {.stages = 3, .micro_batches = 4}),
            (std::vector<std::string>{
                "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3",
                "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3",
                "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3",
            }));
}

// Every (micro-batch, chunk) once as F, and once as B or once as I followed later by once W; the
// forwards and the backwards of each chunk in micro-batch order.
void expect_complete_lists(PipelineSchedule schedule, const PipelineShape& shape) {
  const std::vector<std::vector<PipelineAction>> actions = pipeline_actions(schedule, shape);
  ASSERT_EQ(static_cast<int>(actions.size()), shape.stages);
  const bool split_backward = schedule == PipelineSchedule::kZeroBubble;
  for (int stage = 0; stage < shape.stages; ++stage) {
    SCOPED_TRACE(str("stage ", stage));
    std::map<std::tuple<Kind, int, int>, int> position;  // (kind, micro-batch, chunk) -> index
    std::vector<int> next_forward(shape.chunks, 0), next_backward(shape.chunks, 0);
    for (int index = 0; index < static_cast<int>(actions[stage].size()); ++index) {
      const PipelineAction& action = actions[stage][index];
      ASSERT_TRUE(action.micro_batch >= 0 && action.micro_batch < shape.micro_batches && action.chunk >= 0 &&
                  action.chunk < shape.chunks)
          << action_name(action);
      EXPECT_TRUE(position.emplace(std::tuple(action.kind, action.micro_batch, action.chunk), index).second)
          << action_name(action) << " appears twice";
      if (action.kind == Kind::kForward) {
        EXPECT_EQ(action.micro_batch, next_forward[action.chunk]++);
      }
      if (action.kind == Kind::kBackward || action.kind == Kind::kBackwardInput) {
        EXPECT_EQ(action.micro_batch, next_backward[action.chunk]++);
      }
      EXPECT_TRUE(split_backward ? action.kind != Kind::kBackward
                                 : action.kind == Kind::kForward || action.kind == Kind::kBackward)
          << action_name(action);
    }
    const size_t per_piece = split_backward ? 3 : 2;
    EXPECT_EQ(actions[stage].size(), per_piece * shape.micro_batches * shape.chunks);
    for (int micro_batch = 0; micro_batch < shape.micro_batches; ++micro_batch) {
      for (int chunk = 0; chunk < shape.chunks; ++chunk) {
        auto at = [&](Kind kind) {
          auto found = position.find(std::tuple(kind, micro_batch, chunk));
          return found == position.end() ? -1 : found->second;
        };
        const int forward = at(Kind::kForward);
        EXPECT_GE(forward, 0) << "F" << micro_batch << " chunk " << chunk << " missing";
        if (split_backward) {
          EXPECT_GT(at(Kind::kBackwardInput), forward);
          EXPECT_GT(at(Kind::kBackwardWeight), at(Kind::kBackwardInput));
        } else {
          EXPECT_GT(at(Kind::kBackward), forward);
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, EveryListIsCompleteAndInOrder) {
  for (PipelineSchedule schedule : kAllSchedules) {
    for (const PipelineShape& shape : shapes_of(schedule)) {
      SCOPED_TRACE(describe(schedule, shape));
      expect_complete_lists(schedule, shape);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(PipelineScheduleTest, EveryScheduleRunsWithoutDeadlockWithinItsActivationBound) {
  for (PipelineSchedule schedule : kAllSchedules) {
    for (const PipelineShape& shape : shapes_of(schedule)) {
      SCOPED_TRACE(describe(schedule, shape));
      // Unequal durations and a transfer latency: deadlock depends on the order only, but the
      // ordering of finish times should not matter either.
      for (const PipelineDurations& durations : {PipelineDurations{}, PipelineDurations{1.0, 2.0, 0.5, 0.25}}) {
        const PipelineSimulation simulation = simulate_pipeline(pipeline_actions(schedule, shape), shape, durations);
        ASSERT_FALSE(simulation.deadlock) << simulation.deadlock_description;
        ASSERT_EQ(static_cast<int>(simulation.peak_in_flight.size()), shape.stages);
        for (int stage = 0; stage < shape.stages; ++stage) {
          const int peak = simulation.peak_in_flight[stage];
          switch (schedule) {
            case PipelineSchedule::kGpipe: EXPECT_EQ(peak, shape.micro_batches); break;
            case PipelineSchedule::kOneForwardOneBackward:
            case PipelineSchedule::kZeroBubble: EXPECT_EQ(peak, shape.stages - stage) << "stage " << stage; break;
            case PipelineSchedule::kInterleaved: EXPECT_LE(peak, shape.micro_batches * shape.chunks); break;
          }
        }
      }
    }
  }
}

// Zero bubble's weight passes hold activations too: until W, no stage keeps more than 1f1b's stage 0.
TEST(PipelineScheduleTest, ZeroBubbleKeepsActivationsUntilTheWeightPassWithinOneForwardOneBackwardsPeak) {
  for (const PipelineShape& shape : shapes_of(PipelineSchedule::kZeroBubble)) {
    const std::vector<std::vector<PipelineAction>> actions = pipeline_actions(PipelineSchedule::kZeroBubble, shape);
    for (int stage = 0; stage < shape.stages; ++stage) {
      int held = 0, peak = 0;
      for (const PipelineAction& action : actions[stage]) {
        held += action.kind == Kind::kForward ? 1 : action.kind == Kind::kBackwardWeight ? -1 : 0;
        peak = std::max(peak, held);
      }
      EXPECT_LE(peak, shape.stages) << describe(PipelineSchedule::kZeroBubble, shape) << " stage " << stage;
    }
  }
}

TEST(PipelineScheduleTest, TheoreticalBubbleFormulas) {
  const PipelineShape shape{.stages = 4, .micro_batches = 8};
  EXPECT_DOUBLE_EQ(theoretical_bubble(PipelineSchedule::kGpipe, shape), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(PipelineSchedule::kOneForwardOneBackward, shape, {1.0, 2.0, 0.5}), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(PipelineSchedule::kInterleaved, {4, 8, 2}), 3.0 / 19.0);
  // (p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W)) = 3 / (24 + 3) with equal durations.
  EXPECT_DOUBLE_EQ(theoretical_bubble(PipelineSchedule::kZeroBubble, shape), 3.0 / 27.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(PipelineSchedule::kZeroBubble, shape, {2.0, 1.0, 1.0}), 6.0 / 38.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(PipelineSchedule::kOneForwardOneBackward, {1, 1}), 0.0);
}

// GPipe and 1f1b reach (p-1)/(m+p-1) exactly, whatever the durations; interleaved reaches
// (p-1)/(v*m+p-1) to 1e-9 (the stated tolerance; in practice exactly) with equal or unequal durations.
TEST(PipelineScheduleTest, SimulatedBubbleMatchesTheFormulas) {
  const PipelineDurations equal;
  const PipelineDurations unequal{1.0, 2.0, 0.5};
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward, PipelineSchedule::kInterleaved}) {
    for (const PipelineShape& shape : shapes_of(schedule)) {
      for (const PipelineDurations& durations : {equal, unequal}) {
        const PipelineSimulation simulation = simulate_pipeline(pipeline_actions(schedule, shape), shape, durations);
        EXPECT_NEAR(simulation.bubble, theoretical_bubble(schedule, shape, durations), 1e-9)
            << describe(schedule, shape) << " forward " << durations.forward;
      }
    }
  }
}

// ZB-H1 reaches its formula (to 1e-9) when the weight pass is no longer than the forward and the
// input pass, equal durations included; a longer weight pass leaves more. At m = 4 * stages its
// bubble is well under half of 1f1b's (5/13 of it for large m).
TEST(PipelineScheduleTest, ZeroBubbleReachesZbH1AndBeatsOneForwardOneBackward) {
  for (const PipelineShape& shape : shapes_of(PipelineSchedule::kZeroBubble)) {
    SCOPED_TRACE(describe(PipelineSchedule::kZeroBubble, shape));
    for (const PipelineDurations& durations : {PipelineDurations{}, PipelineDurations{2.0, 1.5, 1.0}}) {
      const PipelineSimulation simulation =
          simulate_pipeline(pipeline_actions(PipelineSchedule::kZeroBubble, shape), shape, durations);
      EXPECT_NEAR(simulation.bubble, theoretical_bubble(PipelineSchedule::kZeroBubble, shape, durations), 1e-9);
    }
    if (shape.stages >= 2) {
      const PipelineDurations long_weight{1.0, 1.0, 2.0};
      EXPECT_GT(simulate_pipeline(pipeline_actions(PipelineSchedule::kZeroBubble, shape), shape, long_weight).bubble,
                theoretical_bubble(PipelineSchedule::kZeroBubble, shape, long_weight));
    }
    if (shape.stages >= 2 && shape.micro_batches == 4 * shape.stages) {
      const double zero_bubble =
          simulate_pipeline(pipeline_actions(PipelineSchedule::kZeroBubble, shape), shape).bubble;
      const double one_forward_one_backward =
          simulate_pipeline(pipeline_actions(PipelineSchedule::kOneForwardOneBackward, shape), shape).bubble;
      EXPECT_LT(zero_bubble, 0.5 * one_forward_one_backward);
    }
  }
}

TEST(PipelineScheduleTest, SimulationOfOneForwardOneBackwardInDetail) {
  const PipelineShape shape{.stages = 4, .micro_batches = 8};
  const PipelineSimulation simulation =
      simulate_pipeline(pipeline_actions(PipelineSchedule::kOneForwardOneBackward, shape), shape);
  // (m + p - 1)(F + B) with F = 1, B = I + W = 2; every stage busy m(F + B) = 24.
  EXPECT_DOUBLE_EQ(simulation.makespan, 33.0);
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_DOUBLE_EQ(simulation.stage_busy[stage], 24.0);
    EXPECT_DOUBLE_EQ(simulation.stage_idle[stage], 9.0);
    // Stage s starts its first forward once micro-batch 0 has come through the s stages before it.
    EXPECT_DOUBLE_EQ(simulation.action_start[stage][0], stage);
    EXPECT_EQ(simulation.action_start[stage].size(), 16u);
  }
  EXPECT_NEAR(simulation.bubble, 9.0 / 33.0, 1e-12);
}

TEST(PipelineScheduleTest, TransferLatencyAddsTwoCrossingsPerStageToGpipe) {
  // The forwards cross p-1 links on the way down and the backwards p-1 on the way up; everything
  // else runs back to back: (m+p-1)(F+B) + 2(p-1)T with F = 1, B = I + W = 2, T = 0.25.
  const PipelineShape shape{.stages = 4, .micro_batches = 6};
  const PipelineDurations durations{1.0, 1.5, 0.5, 0.25};
  const PipelineSimulation simulation =
      simulate_pipeline(pipeline_actions(PipelineSchedule::kGpipe, shape), shape, durations);
  EXPECT_DOUBLE_EQ(simulation.makespan, 9 * 3.0 + 2 * 3 * 0.25);
}

TEST(PipelineScheduleTest, ReceivesQueueWhenTransfersOutlastTheCompute) {
  // F = I = W = 0.1, T = 1: stage 0's forwards end at 0.1, 0.2, 0.3, 0.4, but stage 1 takes one
  // message at a time, so they arrive at 1.1, 2.1, 3.1, 4.1; its last forward ends at 4.2 and its
  // backwards (0.2 each) at 4.4, 4.6, 4.8, 5.0, whose gradients reach stage 0 at 5.4, 6.4, 7.4, 8.4:
  // its last backward ends at 8.6. (Were the transfers independent, the step would end at 3.5.)
  const PipelineShape shape{.stages = 2, .micro_batches = 4};
  const PipelineDurations durations{0.1, 0.1, 0.1, 1.0};
  const PipelineSimulation simulation =
      simulate_pipeline(pipeline_actions(PipelineSchedule::kGpipe, shape), shape, durations);
  EXPECT_NEAR(simulation.makespan, 8.6, 1e-12);
  ASSERT_EQ(simulation.action_start[1].size(), 8u);
  for (int m = 0; m < 4; ++m) EXPECT_NEAR(simulation.action_start[1][m], 1.1 + m, 1e-12) << "forward " << m;
}

TEST(PipelineScheduleTest, SimulatorReportsABackwardListedBeforeItsForward) {
  const PipelineShape shape{.stages = 1, .micro_batches = 2};
  const std::vector<std::vector<PipelineAction>> actions = {
      {{Kind::kForward, 0}, {Kind::kBackward, 1}, {Kind::kForward, 1}, {Kind::kBackward, 0}}};
  const PipelineSimulation simulation = simulate_pipeline(actions, shape);
  EXPECT_TRUE(simulation.deadlock);
  EXPECT_NE(simulation.deadlock_description.find("stage 0 waits at B1 (action 2 of 4) for F1"), std::string::npos)
      << simulation.deadlock_description;
  EXPECT_NE(simulation.deadlock_description.find("later in its own list"), std::string::npos)
      << simulation.deadlock_description;
  EXPECT_EQ(simulation.action_start[0].size(), 1u);  // only F0 ran
}

TEST(PipelineScheduleTest, SimulatorReportsTwoStagesWaitingForEachOther) {
  // Stage 0 waits for B0 from stage 1 before sending F1; stage 1 wants F1 before it runs B0.
  const PipelineShape shape{.stages = 2, .micro_batches = 2};
  const std::vector<std::vector<PipelineAction>> actions = {
      {{Kind::kForward, 0}, {Kind::kBackward, 0}, {Kind::kForward, 1}, {Kind::kBackward, 1}},
      {{Kind::kForward, 0}, {Kind::kForward, 1}, {Kind::kBackward, 0}, {Kind::kBackward, 1}}};
  const PipelineSimulation simulation = simulate_pipeline(actions, shape);
  ASSERT_TRUE(simulation.deadlock);
  const std::string& description = simulation.deadlock_description;
  EXPECT_NE(description.find("stage 0 waits at B0 (action 2 of 4) for B0 of stage 1, which stage 1 has not reached"),
            std::string::npos)
      << description;
  EXPECT_NE(description.find("stage 1 waits at F1 (action 2 of 4) for F1 of stage 0"), std::string::npos)
      << description;
}

TEST(PipelineScheduleTest, SimulatorReportsAWeightPassWhoseInputPassIsMissing) {
  const PipelineShape shape{.stages = 1, .micro_batches = 1};
  const PipelineSimulation simulation = simulate_pipeline({{{Kind::kForward, 0}, {Kind::kBackwardWeight, 0}}}, shape);
  ASSERT_TRUE(simulation.deadlock);
  EXPECT_NE(simulation.deadlock_description.find("B0 or I0 of stage 0, which stage 0 never runs"), std::string::npos)
      << simulation.deadlock_description;
}

TEST(PipelineScheduleTest, SimulatorRejectsListsThatAreNoSchedule) {
  const PipelineShape shape{.stages = 2, .micro_batches = 2};
  EXPECT_NE(error_of([&] { simulate_pipeline({{}}, shape); }).find("1 action lists for 2 stages"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_pipeline({{{Kind::kForward, 2}}, {}}, shape); }).find("outside the shape"),
            std::string::npos);
  EXPECT_NE(error_of([&] { simulate_pipeline({{{Kind::kForward, 0}, {Kind::kForward, 0}}, {}}, shape); })
                .find("stage 0 lists F0 after F0"),
            std::string::npos);
  // B already computes the weight gradient.
  EXPECT_NE(error_of([&] {
              simulate_pipeline({{}, {{Kind::kForward, 0}, {Kind::kBackward, 0}, {Kind::kBackwardWeight, 0}}}, shape);
            }).find("weight gradient"),
            std::string::npos);
  EXPECT_NE(error_of([&] { simulate_pipeline({{}, {}}, shape, {.forward = -1.0}); }).find("forward = -1"),
            std::string::npos);
}

TEST(PipelineScheduleTest, ShapeErrorsNameTheConfigKeys) {
  EXPECT_EQ(error_of([] { check_pipeline_shape(PipelineSchedule::kOneForwardOneBackward, {4, 2, 1}); }),
            "train.micro_batches = 2 is less than parallel.pp = 4: a pipeline needs at least one micro-batch per "
            "stage; set train.micro_batches to 4 or more");
  auto expect_keys = [](PipelineSchedule schedule, PipelineShape shape, std::vector<std::string> keys) {
    const std::string message = error_of([&] { check_pipeline_shape(schedule, shape); });
    ASSERT_FALSE(message.empty()) << describe(schedule, shape);
    for (const std::string& key : keys) EXPECT_NE(message.find(key), std::string::npos) << message;
  };
  expect_keys(PipelineSchedule::kGpipe, {0, 1, 1}, {"parallel.pp = 0"});
  expect_keys(PipelineSchedule::kGpipe, {1, 1, 0}, {"parallel.pp_virtual = 0"});
  expect_keys(PipelineSchedule::kInterleaved, {4, 8, 1}, {"parallel.pp_virtual = 1", "parallel.pp_schedule"});
  expect_keys(PipelineSchedule::kInterleaved, {4, 6, 2},
              {"train.micro_batches = 6", "parallel.pp = 4", "set train.micro_batches to 4 or 8"});
  expect_keys(PipelineSchedule::kZeroBubble, {4, 8, 2},
              {"parallel.pp_virtual = 2", "parallel.pp_schedule = zero_bubble"});
  // pipeline_actions and theoretical_bubble check the shape too.
  EXPECT_FALSE(error_of([] { pipeline_actions(PipelineSchedule::kGpipe, {4, 3, 1}); }).empty());
  EXPECT_FALSE(error_of([] { theoretical_bubble(PipelineSchedule::kInterleaved, {2, 3, 2}); }).empty());
  EXPECT_TRUE(error_of([] { check_pipeline_shape(PipelineSchedule::kInterleaved, {4, 8, 2}); }).empty());
}

}  // namespace
}  // namespace weft
