// Scheduler: the manual plan is program order on one stream with collectives inline; the auto plan
// puts collectives on their comm streams with waits only where dependencies cross streams;
// validate_plan catches missing waits, double runs and deadlocks.
#include "runtime/graph/scheduler.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tests/support/node_specs.h"

namespace weft::graph {
namespace {

using Op = Instruction::Op;

using testing::node_spec;

// A data-parallel step of two layers (backward runs layer 1 then layer 0), one bucket per layer:
// bucket 1's all-reduce needs only backward of layer 1, so it can overlap backward of layer 0.
struct DataParallelStep {
  StepGraph graph;
  NodeId forward, backward1, all_reduce1, backward0, all_reduce0, optimizer;
  DataParallelStep() {
    forward = graph.add_node(node_spec(NodeKind::kForward, "forward mb0"));
    backward1 = graph.add_node(node_spec(NodeKind::kBackward, "backward layer 1"), {forward});
    all_reduce1 = graph.add_node(node_spec(NodeKind::kCollective, "all_reduce bucket 1", StreamClass::kDpComm), {backward1});
    backward0 = graph.add_node(node_spec(NodeKind::kBackward, "backward layer 0"), {backward1});
    all_reduce0 = graph.add_node(node_spec(NodeKind::kCollective, "all_reduce bucket 0", StreamClass::kDpComm), {backward0});
    optimizer = graph.add_node(node_spec(NodeKind::kOptimizer, "optimizer"), {all_reduce1, all_reduce0});
  }
};

std::vector<Instruction> runs(std::initializer_list<NodeId> ids) {
  std::vector<Instruction> out;
  for (NodeId id : ids) out.push_back({Op::kRun, id});
  return out;
}

TEST(Scheduler, ParsesCommModes) {
  EXPECT_EQ(parse_comm_mode("manual"), CommMode::kManual);
  EXPECT_EQ(parse_comm_mode("auto"), CommMode::kAuto);
  EXPECT_STREQ(comm_mode_name(CommMode::kAuto), "auto");
  EXPECT_THROW(parse_comm_mode("overlap"), weft::Error);
}

TEST(Scheduler, ManualPlanIsProgramOrderWithCollectivesInline) {
  DataParallelStep step;
  const ExecutionPlan plan = Scheduler::plan(step.graph, CommMode::kManual);
  EXPECT_EQ(plan.mode, CommMode::kManual);
  // Exactly the insertion order, every node on compute, no waits (stream order covers everything).
  EXPECT_EQ(plan.list(StreamClass::kCompute), runs({0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(plan.list(StreamClass::kDpComm).empty());
  EXPECT_TRUE(plan.list(StreamClass::kTpComm).empty());
  EXPECT_TRUE(plan.list(StreamClass::kP2p).empty());
  for (StreamClass stream : plan.stream_of) EXPECT_EQ(stream, StreamClass::kCompute);
  EXPECT_EQ(plan.order, (std::vector<NodeId>{0, 1, 2, 3, 4, 5}));
}

TEST(Scheduler, ManualPlanFollowsProgramOrderAmongReadyNodes) {
  StepGraph g;
  const NodeId late = g.add_node(node_spec(NodeKind::kForward, "forward mb1"));
  const NodeId early = g.add_node(node_spec(NodeKind::kForward, "forward mb0"));
  g.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm), {late});
  g.add_edge(early, late);  // mb1 after mb0 although added first
  const ExecutionPlan plan = Scheduler::plan(g, CommMode::kManual);
  EXPECT_EQ(plan.list(StreamClass::kCompute), runs({1, 0, 2}));
}

TEST(Scheduler, OrderingPolicyIsFollowedAndChecked) {
  StepGraph g;
  const NodeId first = g.add_node(node_spec(NodeKind::kForward, "forward mb0"));
  const NodeId second = g.add_node(node_spec(NodeKind::kForward, "forward mb1"));
  const NodeId reduce = g.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm), {first});
  // A policy that runs mb1 first (a pipeline schedule would): lists follow it.
  const ExecutionPlan plan = Scheduler::plan(g, CommMode::kAuto, [&](const StepGraph&) {
    return std::vector<NodeId>{second, first, reduce};
  });
  EXPECT_EQ(plan.order, (std::vector<NodeId>{second, first, reduce}));
  EXPECT_EQ(plan.list(StreamClass::kCompute), runs({1, 0}));
  // An order that breaks a dependency, or misses a node, is refused with the nodes named.
  try {
    Scheduler::plan(g, CommMode::kAuto, [&](const StepGraph&) { return std::vector<NodeId>{reduce, first, second}; });
    FAIL() << "expected weft::Error";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("before its dependency 'forward mb0'"), std::string::npos) << error.what();
  }
  EXPECT_THROW(Scheduler::plan(g, CommMode::kManual, [&](const StepGraph&) { return std::vector<NodeId>{first}; }),
               weft::Error);
}

TEST(Scheduler, AutoPlanPutsCollectivesOnCommStreamsWithDependencyWaits) {
  DataParallelStep step;
  const ExecutionPlan plan = Scheduler::plan(step.graph, CommMode::kAuto);
  const std::vector<Instruction> compute = {{Op::kRun, step.forward},     {Op::kRun, step.backward1},
                                            {Op::kRun, step.backward0},   {Op::kWait, step.all_reduce1},
                                            {Op::kWait, step.all_reduce0}, {Op::kRun, step.optimizer}};
  const std::vector<Instruction> dp = {{Op::kWait, step.backward1}, {Op::kRun, step.all_reduce1},
                                       {Op::kWait, step.backward0}, {Op::kRun, step.all_reduce0}};
  EXPECT_EQ(plan.list(StreamClass::kCompute), compute) << plan.to_string(step.graph);
  EXPECT_EQ(plan.list(StreamClass::kDpComm), dp) << plan.to_string(step.graph);
  EXPECT_EQ(plan.stream_of[step.all_reduce1], StreamClass::kDpComm);
  // Backward of layer 0 does not wait for bucket 1: nothing between them on compute.
  EXPECT_EQ(plan.list(StreamClass::kCompute)[2], (Instruction{Op::kRun, step.backward0}));
}

TEST(Scheduler, AutoPlanWaitsOncePerStream) {
  StepGraph g;
  const NodeId b = g.add_node(node_spec(NodeKind::kBackward, "backward"));
  const NodeId ar = g.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm), {b});
  g.add_node(node_spec(NodeKind::kOptimizer, "optimizer part 1"), {ar});
  g.add_node(node_spec(NodeKind::kOptimizer, "optimizer part 2"), {ar});
  const ExecutionPlan plan = Scheduler::plan(g, CommMode::kAuto);
  EXPECT_EQ(plan.list(StreamClass::kCompute),
            (std::vector<Instruction>{{Op::kRun, 0}, {Op::kWait, 1}, {Op::kRun, 2}, {Op::kRun, 3}}));
}

TEST(Scheduler, PlanDumps) {
  DataParallelStep step;
  const ExecutionPlan plan = Scheduler::plan(step.graph, CommMode::kAuto);
  const std::string text = plan.to_string(step.graph);
  EXPECT_NE(text.find("dp_comm: wait 'backward layer 1'; run 'all_reduce bucket 1'"), std::string::npos) << text;
  const nlohmann::json json = nlohmann::json::parse(plan.to_json());
  EXPECT_EQ(json["mode"], "auto");
  EXPECT_EQ(json["streams"]["dp_comm"].size(), 4u);
  EXPECT_EQ(json["streams"]["dp_comm"][1]["op"], "run");
  EXPECT_EQ(json["streams"]["dp_comm"][1]["node"], step.all_reduce1);
}

TEST(Scheduler, ValidatePlanFindsMistakes) {
  DataParallelStep step;
  ExecutionPlan plan = Scheduler::plan(step.graph, CommMode::kAuto);
  EXPECT_NO_THROW(validate_plan(step.graph, plan));

  ExecutionPlan missing_wait = plan;
  auto& compute = missing_wait.list(StreamClass::kCompute);
  compute.erase(compute.begin() + 3);  // drop "wait all_reduce bucket 1"
  try {
    validate_plan(step.graph, missing_wait);
    FAIL() << "a missing wait was accepted";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("'optimizer' on stream compute may start before its dependency "
                                             "'all_reduce bucket 1'"),
              std::string::npos)
        << error.what();
  }

  ExecutionPlan twice = plan;
  twice.list(StreamClass::kCompute).push_back({Op::kRun, step.optimizer});
  EXPECT_THROW(validate_plan(step.graph, twice), weft::Error);

  // dp_comm waits for the optimizer, which waits for dp_comm's all-reduces.
  ExecutionPlan deadlock = plan;
  auto& dp = deadlock.list(StreamClass::kDpComm);
  dp.insert(dp.begin(), {Op::kWait, step.optimizer});
  try {
    validate_plan(step.graph, deadlock);
    FAIL() << "a deadlock was accepted";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("deadlocks"), std::string::npos) << error.what();
  }
}

TEST(Scheduler, EmptyGraph) {
  StepGraph g;
  const ExecutionPlan plan = Scheduler::plan(g, CommMode::kAuto);
  for (const auto& list : plan.streams) EXPECT_TRUE(list.empty());
}

}  // namespace
}  // namespace weft::graph
