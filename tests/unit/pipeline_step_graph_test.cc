// The pipeline step graph and its schedules, without MPI: every stage's graph is built and planned
// in both comm modes, and the plans of all stages are run together by a small simulator of the
// executor (stream lists, waits, sends that never wait, receives that wait for their send,
// step-wide collectives over the stages) to show that no schedule deadlocks and that every send
// meets exactly one receive, for pp up to 8 and many micro-batch counts; and under NCCL's rules
// (in-order pairing, sends and receives that wait for each other), what an NCCL transport needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "parallel/data/reducer.h"
#include "parallel/pipeline/pipeline_step_builder.h"
#include "runtime/error.h"
#include "runtime/graph/scheduler.h"

namespace weft {
namespace {

using graph::CommMode;
using graph::ExecutionPlan;
using graph::Instruction;
using graph::NodeId;
using graph::NodeKind;
using graph::StepGraph;

struct StagePlan {
  std::unique_ptr<Reducer> reducer;  // with_tied_exchange only
  std::set<std::string> exchanging_nodes;  // the names of its buckets' nodes that exchange
  StepState state;
  StepGraph graph;
  ExecutionPlan plan;
  std::vector<PipelineAction> actions;
};

// Segments that compute nothing (the graph is only inspected): `count` of them.
std::vector<ModelSegment> fake_segments(int count) {
  std::vector<ModelSegment> segments;
  for (int s = 0; s < count; ++s) {
    segments.push_back({str("segment ", s), [](const Tensor& x) { return x; }, {}});
  }
  return segments;
}

// Virtual stage j takes segments [j * per, (j + 1) * per), the last one the rest.
std::vector<int> even_cut(int segments, int virtual_stages) {
  std::vector<int> first;
  for (int j = 0; j < virtual_stages; ++j) first.push_back(j * (segments / virtual_stages));
  first.push_back(segments);
  return first;
}

// The reducer of a stage holding `held` segments, as the data-parallel strategy makes it for a
// tied embedding: one bucket per held segment, in backward order, each with one parameter; the
// buckets of segment 0 (the embedding) and of the last segment (the head that reads it) exchange
// their gradient with the other stage first. The simulator treats the node of such a bucket
// ("reduce bucket b", named in StagePlan::exchanging_nodes) as a collective of the first and the
// last stage.
std::unique_ptr<Reducer> tied_exchange_reducer(const std::vector<int>& held, int segments, CommMode mode) {
  BucketReductions reductions;
  reductions.operation = "reduce";
  for (auto segment = held.rbegin(); segment != held.rend(); ++segment) {
    reductions.bucket_of_parameter.push_back(reductions.ready_segment.size());
    reductions.final_segment.push_back(*segment);
    reductions.ready_segment.push_back(*segment);
    reductions.bytes.push_back(4);
    reductions.exchanges_with_stage.push_back(*segment == 0 || *segment == segments - 1);
  }
  if (mode == CommMode::kManual) return std::make_unique<ManualReducer>(std::move(reductions));
  return std::make_unique<OverlappedReducer>(std::move(reductions));
}

std::vector<std::unique_ptr<StagePlan>> plan_stages(PipelineSchedule schedule, int stages, int micro_batches,
                                                    int chunks, CommMode mode, bool with_tied_exchange = false) {
  const int segments = stages * chunks + 2;
  std::vector<std::unique_ptr<StagePlan>> plans;
  for (int stage = 0; stage < stages; ++stage) {
    auto plan = std::make_unique<StagePlan>();
    PipelineRecipe recipe;
    recipe.step.segments = fake_segments(segments);
    recipe.step.micro_batches = micro_batches;
    recipe.step.device = Device::cpu();
    recipe.step.update = [](StepState&) {};
    recipe.step.average_loss = [](const graph::NodeContext&) -> CompletionPtr { return nullptr; };
    recipe.placement = {stage, stages, chunks, even_cut(segments, stages * chunks)};
    recipe.schedule = schedule;
    recipe.post_receives_early = mode == CommMode::kAuto;
    if (with_tied_exchange) {
      std::vector<int> held;
      for (int segment = 0; segment < segments; ++segment) {
        if (recipe.placement.holds(segment)) held.push_back(segment);
      }
      plan->reducer = tied_exchange_reducer(held, segments, mode);
      for (size_t bucket = 0; bucket < held.size(); ++bucket) {
        const int segment = held[held.size() - 1 - bucket];
        if (segment == 0 || segment == segments - 1) plan->exchanging_nodes.insert(str("reduce bucket ", bucket));
      }
      recipe.step.reducer = plan->reducer.get();
    }
    PipelineStepGraph built = build_pipeline_step_graph(recipe, plan->state);
    plan->graph = std::move(built.graph);
    plan->actions = built.actions;
    plan->plan = graph::Scheduler::plan(plan->graph, mode, built.ordering);
    plans.push_back(std::move(plan));
  }
  return plans;
}

// A step-wide collective over the stages: the loss's sum and the optimizer's norm sum.
bool is_stage_collective(const graph::Node& node) {
  return node.kind == NodeKind::kOptimizer || (node.kind == NodeKind::kCollective && node.name == "all_reduce loss");
}

// How a stage's host issues its lists, in the simulator below.
enum class Issuing {
  kThreadPerList,  // the CPU executor: a thread per list; a receive waiting holds only its list
  kOneThread,      // the CUDA executor: one thread issues every list in stream-class order and runs
                   // blocks_host nodes on host workers; any other node that waits on the host (the
                   // tied gradient's exchange) holds every list of its stage until it completes
  kOneThreadNoWorkers,  // the same without host workers (weft before 2026-12-04): receives hold all
};

// How a send meets its receive, in the simulator below.
enum class Matching {
  kTagged,       // weft's transport (MPI): a receive takes the message with its tag whenever it was
                 // sent, and a send never waits for its receiver
  kInOrderRendezvous,  // NCCL's ncclSend / ncclRecv: the k-th send from A to B meets the k-th receive
                       // on B from A, and each waits until the other has been reached on its stream
};

// The ordinal of each send among the stage's sends to the same peer, and of each receive among
// its receives from the same peer, in the order the stage's lists hold them (node id -> ordinal).
// Sends to one peer (or receives from one) spread over two lists have no one order: "" otherwise
// names them.
std::string pairing_ordinals(const StagePlan& stage, std::map<NodeId, int>& ordinal) {
  std::map<std::pair<int, int>, int> count;       // (send 1 / receive 0, peer) -> how many so far
  std::map<std::pair<int, int>, int> list_of;     // (send 1 / receive 0, peer) -> the list holding them
  for (int s = 0; s < graph::kStreamClassCount; ++s) {
    for (const Instruction& instruction : stage.plan.streams[s]) {
      const graph::Node& node = stage.graph.node(instruction.node);
      if (instruction.op != Instruction::Op::kRun || (node.kind != NodeKind::kSend && node.kind != NodeKind::kRecv)) {
        continue;
      }
      const std::pair<int, int> key = {node.kind == NodeKind::kSend ? 1 : 0, node.peer};
      const auto [where, inserted] = list_of.emplace(key, s);
      if (!inserted && where->second != s) return str(node.name, " is on another list than its peer's others");
      ordinal[node.id] = count[key]++;
    }
  }
  return "";
}

// Runs every stage's plan at once until all is done or nothing can move; returns "" or what is stuck.
std::string simulate(const std::vector<std::unique_ptr<StagePlan>>& plans, Issuing issuing = Issuing::kThreadPerList,
                     Matching matching = Matching::kTagged) {
  const int stages = static_cast<int>(plans.size());
  // In-order matching: (from, to, ordinal) -> {the send reached, the receive reached}.
  std::vector<std::map<NodeId, int>> ordinal(stages);
  std::map<std::tuple<int, int, int>, std::array<bool, 2>> reached;
  if (matching == Matching::kInOrderRendezvous) {
    std::map<std::tuple<int, int, int>, int64_t> send_tags;
    for (int r = 0; r < stages; ++r) {
      const std::string ambiguous = pairing_ordinals(*plans[r], ordinal[r]);
      if (!ambiguous.empty()) return str("stage ", r, ": ", ambiguous);
      for (const graph::Node& node : plans[r]->graph.nodes()) {
        if (node.kind == NodeKind::kSend) send_tags[{r, node.peer, ordinal[r][node.id]}] = node.tag;
      }
    }
    for (int r = 0; r < stages; ++r) {
      for (const graph::Node& node : plans[r]->graph.nodes()) {
        if (node.kind != NodeKind::kRecv) continue;
        const int k = ordinal[r][node.id];
        if (send_tags[{node.peer, r, k}] != node.tag) {
          return str("stage ", r, "'s receive ", k, " from stage ", node.peer, " (", node.name,
                     ") would meet a send of another message");
        }
      }
    }
  }
  // Whether node (a send or a receive) of stage r has met its partner; marks it reached.
  auto rendezvous = [&](int r, const graph::Node& node) {
    const bool is_send = node.kind == NodeKind::kSend;
    const std::tuple<int, int, int> key = is_send ? std::make_tuple(r, node.peer, ordinal[r][node.id])
                                                  : std::make_tuple(node.peer, r, ordinal[r][node.id]);
    std::array<bool, 2>& both = reached[key];
    both[is_send ? 0 : 1] = true;
    return both[0] && both[1];
  };
  std::vector<std::vector<char>> done(stages);
  std::vector<std::array<size_t, graph::kStreamClassCount>> position(stages);
  std::set<std::tuple<int, int, int64_t>> sent;  // (from, to, tag)
  std::map<std::string, int> collective_arrivals;
  for (int r = 0; r < stages; ++r) {
    done[r].assign(plans[r]->graph.size(), 0);
    position[r].fill(0);
  }
  // One issuing thread: the list whose node holds the stage's host thread (-1: none). The thread
  // goes on from there once the node completes, and only then reaches the other lists.
  const bool one_thread = issuing != Issuing::kThreadPerList;
  std::vector<int> held_in(stages, -1);
  std::vector<std::array<bool, graph::kStreamClassCount>> busy(stages);  // a producer's list, re-entered
  for (auto& lists : busy) lists.fill(false);
  bool moved = true;
  // Runs list s of stage r until it waits, is held, or ends.
  std::function<void(int, int)> run_list = [&](int r, int s) {
    if (busy[r][s]) return;
    const std::vector<Instruction>& list = plans[r]->plan.streams[s];
    while (position[r][s] < list.size() && held_in[r] < 0) {
      const Instruction& instruction = list[position[r][s]];
      const graph::Node& node = plans[r]->graph.node(instruction.node);
      std::vector<NodeId> signals;
      for (NodeId dependent : node.dependents) {
        if (plans[r]->graph.node(dependent).signal_of == node.id) signals.push_back(dependent);
      }
      if (instruction.op == Instruction::Op::kWait) {
        if (!done[r][instruction.node]) break;
      } else if (matching == Matching::kInOrderRendezvous &&
                 (node.kind == NodeKind::kRecv || node.kind == NodeKind::kSend)) {
        if (!rendezvous(r, node)) break;  // its stream waits in the kernel for the partner
        done[r][node.id] = 1;
      } else if (node.kind == NodeKind::kRecv) {
        if (!sent.count({node.peer, r, node.tag})) {
          const bool on_worker = issuing == Issuing::kOneThread && node.blocks_host;
          if (one_thread && !on_worker) held_in[r] = s;
          break;
        }
        done[r][node.id] = 1;
      } else if (node.kind == NodeKind::kSend) {
        EXPECT_TRUE(sent.insert({r, node.peer, node.tag}).second) << "stage " << r << " sends tag " << node.tag
                                                                   << " twice";
        done[r][node.id] = 1;
      } else if (is_stage_collective(node) || plans[r]->exchanging_nodes.count(node.name)) {
        // Arrive once; complete when every stage (an exchange: the first and the last) has arrived.
        const bool exchange = !is_stage_collective(node);
        int& arrivals = collective_arrivals[exchange ? "exchange" : node.name];
        if (done[r][node.id] == 0) {
          done[r][node.id] = 2;  // arrived, not complete
          ++arrivals;
        }
        if (arrivals < (exchange ? 2 : stages)) {
          // The exchange waits on the host (an MPI receive inside the bucket's reduce).
          if (exchange && one_thread) held_in[r] = s;
          break;
        }
        done[r][node.id] = 1;
      } else if (one_thread && !signals.empty()) {
        // The CUDA executor fires a producer's signals from inside its work and, re-entering its
        // loop there, issues the lists that waited for them before the rest of the producer: a
        // node there that holds the host holds the producer, and its list, too.
        for (NodeId signal : signals) done[r][signal] = 1;
        busy[r][s] = true;
        for (int other = 0; other < graph::kStreamClassCount && held_in[r] < 0; ++other) run_list(r, other);
        busy[r][s] = false;
        if (held_in[r] >= 0) break;  // the producer is taken up again once the thread is let go
        done[r][node.id] = 1;
      } else {
        done[r][node.id] = 1;
      }
      ++position[r][s];
      moved = true;
    }
  };
  while (moved) {
    moved = false;
    for (int r = 0; r < stages; ++r) {
      const int first_list = held_in[r] >= 0 ? held_in[r] : 0;
      held_in[r] = -1;
      for (int s = first_list; s < graph::kStreamClassCount && held_in[r] < 0; ++s) run_list(r, s);
    }
  }
  std::string stuck;
  for (int r = 0; r < stages; ++r) {
    for (int s = 0; s < graph::kStreamClassCount; ++s) {
      const std::vector<Instruction>& list = plans[r]->plan.streams[s];
      if (position[r][s] < list.size()) {
        const Instruction& instruction = list[position[r][s]];
        stuck += str("stage ", r, " ", graph::stream_class_name(graph::kAllStreamClasses[s]), " at ",
                     instruction.op == Instruction::Op::kWait ? "wait " : "run ",
                     plans[r]->graph.node(instruction.node).name, "; ");
      }
    }
  }
  return stuck;
}

// Every send has one receive on its peer with its tag, and the other way round.
void expect_matched(const std::vector<std::unique_ptr<StagePlan>>& plans) {
  std::multiset<std::tuple<int, int, int64_t>> sends, receives;
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    for (const graph::Node& node : plans[r]->graph.nodes()) {
      if (node.kind == NodeKind::kSend) sends.insert({r, node.peer, node.tag});
      if (node.kind == NodeKind::kRecv) receives.insert({node.peer, r, node.tag});
    }
  }
  EXPECT_EQ(sends, receives);
}

struct Case {
  PipelineSchedule schedule;
  int stages;
  int micro_batches;
  int chunks;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int stages = 2; stages <= 8; ++stages) {
    for (int m = stages; m <= 3 * stages; m += (m < stages + 2 ? 1 : stages)) {
      out.push_back({PipelineSchedule::kGpipe, stages, m, 1});
      out.push_back({PipelineSchedule::kOneForwardOneBackward, stages, m, 1});
      out.push_back({PipelineSchedule::kZeroBubble, stages, m, 1});
      if (m % stages == 0) {
        for (int chunks = 2; chunks <= 3; ++chunks) out.push_back({PipelineSchedule::kInterleaved, stages, m, chunks});
      }
    }
  }
  return out;
}

TEST(PipelineStepGraph, EverySchedulePlansWithoutDeadlockInBothModes) {
  int checked = 0;
  for (const Case& c : cases()) {
    for (CommMode mode : {CommMode::kManual, CommMode::kAuto}) {
      SCOPED_TRACE(str(pipeline_schedule_name(c.schedule), " pp ", c.stages, " m ", c.micro_batches, " chunks ",
                       c.chunks, " ", graph::comm_mode_name(mode)));
      const auto plans = plan_stages(c.schedule, c.stages, c.micro_batches, c.chunks, mode);
      expect_matched(plans);
      EXPECT_EQ(simulate(plans), "");
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
}

// The CUDA executor issues every list of a stage from one host thread (docs/architecture.md,
// "Pipelines on GPUs"). A pipeline receive waits on the host, so it runs on a host worker
// (blocks_host); the tied gradient's exchange, which waits on the host too, is ordered after the
// stage's last send. With both, no plan of any schedule deadlocks, in either mode, with a tied
// embedding. Without the workers the auto mode's receives posted early do (1F1B at pp 2: stage 1
// waits for activation 1 before it has issued the backward that stage 0 waits for).
TEST(PipelineStepGraph, NoPlanDeadlocksTheCudaExecutorsOneIssuingThread) {
  int deadlocks_without_workers = 0;
  int exchanges = 0;
  for (const Case& c : cases()) {
    for (CommMode mode : {CommMode::kManual, CommMode::kAuto}) {
      SCOPED_TRACE(str(pipeline_schedule_name(c.schedule), " pp ", c.stages, " m ", c.micro_batches, " chunks ",
                       c.chunks, " ", graph::comm_mode_name(mode)));
      const auto plans = plan_stages(c.schedule, c.stages, c.micro_batches, c.chunks, mode, true);
      expect_matched(plans);
      EXPECT_EQ(simulate(plans, Issuing::kThreadPerList), "");
      EXPECT_EQ(simulate(plans, Issuing::kOneThread), "");
      deadlocks_without_workers += !simulate(plans, Issuing::kOneThreadNoWorkers).empty();
      for (const auto& stage : plans) {
        NodeId last_send = -1;
        for (const graph::Node& node : stage->graph.nodes()) {
          if (node.kind == NodeKind::kRecv) EXPECT_TRUE(node.blocks_host) << node.name;
          if (node.kind == NodeKind::kSend) last_send = node.id;
        }
        for (const graph::Node& node : stage->graph.nodes()) {
          if (!stage->exchanging_nodes.count(node.name)) continue;
          ASSERT_GE(last_send, 0);
          EXPECT_NE(std::find(node.dependencies.begin(), node.dependencies.end(), last_send), node.dependencies.end())
              << node.name << " does not wait for " << stage->graph.node(last_send).name;
          ++exchanges;
        }
      }
    }
  }
  EXPECT_GT(exchanges, 0);
  EXPECT_GT(deadlocks_without_workers, 0);
  const std::string stuck = simulate(plan_stages(PipelineSchedule::kOneForwardOneBackward, 2, 8, 1, CommMode::kAuto),
                                     Issuing::kOneThreadNoWorkers);
  EXPECT_NE(stuck.find("recv activation 1"), std::string::npos) << stuck;
}

// What NCCL's point-to-point would need of the plans (docs/architecture.md, "Pipelines on GPUs"):
// ncclSend / ncclRecv pair the k-th send from A to B with the k-th receive on B from A, and each
// waits on its stream until the other is reached. Every plan pairs its messages in order (the
// sends to a peer and the receives from it each lie on one list, in the same order as the peer's),
// and in the auto mode, whose receives run on the p2p stream (a stream waiting in a receive never
// holds the compute that makes the peer's next message; posting them early or not), no plan
// deadlocks under those waits. The manual mode's plans, which wait for each receive on the
// compute stream where it is written, deadlock from pp 2 in every schedule that has a steady state
// (1F1B: stage 0 sends activation k while stage 1 sends gradient k - 1, each waiting for the
// other's receive): an NCCL transport would have to group such a send with the receive beside it,
// as Megatron-LM's send_forward_recv_backward does.
TEST(PipelineStepGraph, NcclStylePairingKeepsTheAutoModesPlansLive) {
  int auto_checked = 0, manual_checked = 0, manual_deadlocks = 0;
  std::map<std::string, int> manual_deadlocks_by_schedule;
  for (const Case& c : cases()) {
    for (CommMode mode : {CommMode::kManual, CommMode::kAuto}) {
      SCOPED_TRACE(str(pipeline_schedule_name(c.schedule), " pp ", c.stages, " m ", c.micro_batches, " chunks ",
                       c.chunks, " ", graph::comm_mode_name(mode)));
      const auto plans = plan_stages(c.schedule, c.stages, c.micro_batches, c.chunks, mode);
      const std::string stuck = simulate(plans, Issuing::kThreadPerList, Matching::kInOrderRendezvous);
      EXPECT_EQ(stuck.find("another"), std::string::npos) << stuck;  // pairs in order, from one list each
      if (mode == CommMode::kAuto) {
        EXPECT_EQ(stuck, "");
        ++auto_checked;
      } else {
        ++manual_checked;
        if (!stuck.empty()) {
          ++manual_deadlocks;
          ++manual_deadlocks_by_schedule[pipeline_schedule_name(c.schedule)];
        }
      }
    }
  }
  EXPECT_GT(auto_checked, 75);
  EXPECT_EQ(manual_deadlocks_by_schedule.count("gpipe"), 0u) << "all forwards, then all backwards, pair as they come";
  EXPECT_GT(manual_deadlocks_by_schedule["1f1b"], 0);
  const std::string stuck = simulate(plan_stages(PipelineSchedule::kOneForwardOneBackward, 2, 4, 1, CommMode::kManual),
                                     Issuing::kThreadPerList, Matching::kInOrderRendezvous);
  EXPECT_NE(stuck.find("stage 0 compute at run send activation"), std::string::npos) << stuck;
  EXPECT_NE(stuck.find("stage 1 compute at run send gradient"), std::string::npos) << stuck;
  std::string summary;
  for (const auto& [schedule, count] : manual_deadlocks_by_schedule) summary += str(schedule, " ", count, "; ");
  std::printf("manual mode under in-order rendezvous: %d of %d plans stick (%s)\n", manual_deadlocks, manual_checked,
              summary.c_str());
}

TEST(PipelineStepGraph, TheComputeOrderIsTheSchedule) {
  // 1F1B at pp 3, m 4: stage 0's forward and backward nodes follow its action list.
  const auto plans = plan_stages(PipelineSchedule::kOneForwardOneBackward, 3, 4, 1, CommMode::kManual);
  for (int stage = 0; stage < 3; ++stage) {
    std::vector<std::string> order;
    for (const Instruction& instruction : plans[stage]->plan.list(graph::StreamClass::kCompute)) {
      const graph::Node& node = plans[stage]->graph.node(instruction.node);
      if (instruction.op != Instruction::Op::kRun) continue;
      if (node.kind != NodeKind::kForward && node.kind != NodeKind::kBackward) continue;
      // One entry per action: the first node of each action.
      const std::string action = str(node.kind == NodeKind::kForward ? "F" : "B", node.micro_batch);
      if (order.empty() || order.back() != action) order.push_back(action);
    }
    std::vector<std::string> expected;
    for (const PipelineAction& action : plans[stage]->actions) expected.push_back(action_name(action));
    EXPECT_EQ(order, expected) << "stage " << stage;
  }
}

TEST(PipelineStepGraph, ManualModeRunsEverythingOnComputeAutoModeUsesTheP2pStream) {
  const auto manual = plan_stages(PipelineSchedule::kOneForwardOneBackward, 2, 4, 1, CommMode::kManual);
  const auto automatic = plan_stages(PipelineSchedule::kOneForwardOneBackward, 2, 4, 1, CommMode::kAuto);
  EXPECT_TRUE(manual[0]->plan.list(graph::StreamClass::kP2p).empty());
  EXPECT_FALSE(automatic[0]->plan.list(graph::StreamClass::kP2p).empty());
  // In the auto mode the p2p stream receives (sends are posted from compute, never waiting), and a
  // receive comes before the action ahead of the one that needs it: stage 1 (1F1B: F0 B0 F1 B1 ...)
  // posts its second activation's receive before it runs B0.
  std::vector<std::string> p2p;
  for (const Instruction& instruction : automatic[1]->plan.list(graph::StreamClass::kP2p)) {
    const graph::Node& node = automatic[1]->graph.node(instruction.node);
    if (instruction.op == Instruction::Op::kRun) p2p.push_back(node.name);
    if (instruction.op == Instruction::Op::kRun) EXPECT_EQ(node.kind, NodeKind::kRecv) << node.name;
  }
  const std::vector<std::string> expected_start = {"recv activation 1 mb0", "recv activation 1 mb1"};
  ASSERT_GE(p2p.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(p2p.begin(), p2p.begin() + 2), expected_start);
  const std::vector<Instruction>& compute = automatic[1]->plan.list(graph::StreamClass::kCompute);
  const auto position = [&](const std::string& name) {
    for (size_t i = 0; i < compute.size(); ++i) {
      if (compute[i].op == Instruction::Op::kRun && automatic[1]->graph.node(compute[i].node).name == name) return i;
    }
    return compute.size();
  };
  // The receive is waited for only where F1 needs it, after B0 ran.
  EXPECT_LT(position("backward segment 3 mb0"), position("forward segment 2 mb1"));
}

TEST(PipelineStepGraph, ZeroBubbleSplitsEveryBackward) {
  const auto plans = plan_stages(PipelineSchedule::kZeroBubble, 2, 4, 1, CommMode::kManual);
  int inputs = 0, weights = 0;
  for (const graph::Node& node : plans[0]->graph.nodes()) {
    if (node.name.rfind("backward input ", 0) == 0) ++inputs;
    if (node.name.rfind("backward weight ", 0) == 0) ++weights;
  }
  // Stage 0 of 2 holds 2 of the 4 segments: 4 micro-batches x 2 segments of each.
  EXPECT_EQ(inputs, 8);
  EXPECT_EQ(weights, 8);
}

TEST(PipelineStepGraph, TagsAreDistinctPerDirectionBoundaryAndMicroBatch) {
  std::set<int64_t> tags;
  for (int boundary = 0; boundary < 7; ++boundary) {
    for (int64_t micro = 0; micro < 16; ++micro) {
      for (bool gradient : {false, true}) EXPECT_TRUE(tags.insert(pipeline_message_tag(gradient, boundary, micro, 16)).second);
    }
  }
}

TEST(PipelineStepGraph, ABadCutIsRefused) {
  StepState state;
  PipelineRecipe recipe;
  recipe.step.segments = fake_segments(4);
  recipe.step.update = [](StepState&) {};
  recipe.placement = {0, 2, 1, {0, 0, 4}};  // an empty stage
  EXPECT_THROW(build_pipeline_step_graph(recipe, state), Error);
}

}  // namespace
}  // namespace weft
