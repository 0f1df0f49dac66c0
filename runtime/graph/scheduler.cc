// Scheduler (see scheduler.h): program order, stream assignment per comm mode, waits, validation.
//
// plan() is three steps: (1) the order every list follows (the caller's ordering policy, checked
// to be topological), (2) the stream each node runs on (where the comm modes differ; the auto
// mode's version is marked as the hook a later issue replaces), (3) the lists, with a wait
// inserted before a node for each dependency that runs on another stream (once per stream: a
// stream that already waited for a node does not wait again).
#include "runtime/graph/scheduler.h"

#include <sstream>

#include "runtime/error.h"

namespace weft::graph {

const char* comm_mode_name(CommMode mode) {
  switch (mode) {
    case CommMode::kManual: return "manual";
    case CommMode::kAuto: return "auto";
  }
  return "unknown";
}

CommMode parse_comm_mode(std::string_view text) {
  if (text == "manual") return CommMode::kManual;
  if (text == "auto") return CommMode::kAuto;
  WEFT_FAIL("comm.mode '", text, "' is not a comm mode; use 'manual' or 'auto'");
}

namespace {

// --- manual mode ------------------------------------------------------------------------------
// What a hand-written program does: everything on the compute stream, in the order it was written.

std::vector<StreamClass> manual_streams(const StepGraph& graph) {
  return std::vector<StreamClass>(graph.size(), StreamClass::kCompute);
}

// --- auto mode: the hook a later issue replaces ---------------------------------------------
// Today: each node on the stream class its builder gave it. The dependency waits inserted by build_lists are then the only points where streams meet, which already
// overlaps every collective with whatever compute does not depend on it. What goes here later:
// ordering by priority (post pipeline sends and recvs early, issue the buckets backward produces
// first), chunking tensor-parallel collectives around their matmuls, merging or splitting
// buckets by the calibrated cost model. Any order returned must be topological and any stream
// assignment is allowed: build_lists and validate_plan keep the plan correct.

std::vector<StreamClass> auto_streams(const StepGraph& graph) {
  std::vector<StreamClass> streams(graph.size());
  for (const Node& node : graph.nodes()) streams[node.id] = node.stream;
  return streams;
}

// --- shared lowering --------------------------------------------------------------------------

void build_lists(const StepGraph& graph, ExecutionPlan& plan) {
  // waited[s][n]: stream s has already waited for node n (so it need not wait again).
  std::array<std::vector<char>, kStreamClassCount> waited;
  for (auto& flags : waited) flags.assign(graph.size(), 0);
  for (NodeId id : plan.order) {
    const StreamClass stream = plan.stream_of[id];
    const int s = static_cast<int>(stream);
    for (NodeId dependency : graph.node(id).dependencies) {
      if (plan.stream_of[dependency] == stream || waited[s][dependency]) continue;
      plan.streams[s].push_back({Instruction::Op::kWait, dependency});
      waited[s][dependency] = 1;
    }
    plan.streams[s].push_back({Instruction::Op::kRun, id});
  }
}

}  // namespace

std::vector<NodeId> program_order(const StepGraph& graph) { return graph.topological_order(); }

ExecutionPlan Scheduler::plan(const StepGraph& graph, CommMode mode, const OrderingPolicy& ordering) {
  ExecutionPlan plan;
  plan.mode = mode;
  plan.order = ordering(graph);
  WEFT_CHECK(static_cast<int>(plan.order.size()) == graph.size(), "scheduler: the ordering policy returned ",
             plan.order.size(), " nodes for a graph of ", graph.size());
  std::vector<char> placed(graph.size(), 0);
  for (NodeId id : plan.order) {
    WEFT_CHECK(id >= 0 && id < graph.size() && !placed[id], "scheduler: the ordering policy names node ", id,
               " twice or out of range");
    for (NodeId dependency : graph.node(id).dependencies) {
      WEFT_CHECK(placed[dependency], "scheduler: the ordering policy puts '", graph.node(id).name, "' before its "
                 "dependency '", graph.node(dependency).name, "'");
    }
    placed[id] = 1;
  }
  plan.stream_of = mode == CommMode::kManual ? manual_streams(graph) : auto_streams(graph);
  build_lists(graph, plan);
  validate_plan(graph, plan);
  return plan;
}

void validate_plan(const StepGraph& graph, const ExecutionPlan& plan) {
  const int n = graph.size();
  WEFT_CHECK(static_cast<int>(plan.stream_of.size()) == n, "execution plan: it places ", plan.stream_of.size(),
             " nodes but the graph has ", n);
  std::vector<int> runs(n, 0);
  for (StreamClass stream : kAllStreamClasses) {
    // Nodes known complete at this point of this stream: run earlier on it, or waited for.
    std::vector<char> available(n, 0);
    for (const Instruction& instruction : plan.list(stream)) {
      WEFT_CHECK(instruction.node >= 0 && instruction.node < n, "execution plan: stream ",
                 stream_class_name(stream), " names node ", instruction.node, ", which is not in the graph");
      const Node& node = graph.node(instruction.node);
      if (instruction.op == Instruction::Op::kWait) {
        available[node.id] = 1;
        continue;
      }
      WEFT_CHECK(plan.stream_of[node.id] == stream, "execution plan: node '", node.name, "' runs on stream ",
                 stream_class_name(stream), " but is placed on ", stream_class_name(plan.stream_of[node.id]));
      for (NodeId dependency : node.dependencies) {
        WEFT_CHECK(available[dependency], "execution plan: node '", node.name, "' on stream ",
                   stream_class_name(stream), " may start before its dependency '", graph.node(dependency).name,
                   "' (on ", stream_class_name(plan.stream_of[dependency]), ") is complete: no wait for it");
      }
      ++runs[node.id];
      available[node.id] = 1;
    }
  }
  for (const Node& node : graph.nodes()) {
    WEFT_CHECK(runs[node.id] == 1, "execution plan: node '", node.name, "' is run ", runs[node.id],
               " times (once expected)");
  }
  // Deadlock check: advance every stream as far as completed nodes allow until none can move.
  std::vector<char> complete(n, 0);
  std::array<size_t, kStreamClassCount> position{};
  int remaining = n;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < kStreamClassCount; ++s) {
      const auto& list = plan.streams[s];
      while (position[s] < list.size()) {
        const Instruction& instruction = list[position[s]];
        if (instruction.op == Instruction::Op::kWait && !complete[instruction.node]) break;
        if (instruction.op == Instruction::Op::kRun) {
          complete[instruction.node] = 1;
          --remaining;
        }
        ++position[s];
        progress = true;
      }
    }
  }
  if (remaining > 0) {
    std::ostringstream stuck;
    for (int s = 0; s < kStreamClassCount; ++s) {
      if (position[s] >= plan.streams[s].size()) continue;
      stuck << " " << stream_class_name(kAllStreamClasses[s]) << " waits for '"
            << graph.node(plan.streams[s][position[s]].node).name << "';";
    }
    WEFT_FAIL("execution plan deadlocks:", stuck.str(), " no stream can proceed");
  }
}

std::string ExecutionPlan::to_string(const StepGraph& graph) const {
  std::ostringstream out;
  out << comm_mode_name(mode) << " plan\n";
  for (StreamClass stream : kAllStreamClasses) {
    const auto& instructions = list(stream);
    if (instructions.empty()) continue;
    out << "  " << stream_class_name(stream) << ":";
    for (size_t i = 0; i < instructions.size(); ++i) {
      out << (i ? "; " : " ") << (instructions[i].op == Instruction::Op::kRun ? "run '" : "wait '")
          << graph.node(instructions[i].node).name << "'";
    }
    out << "\n";
  }
  return out.str();
}

std::string ExecutionPlan::to_json() const {
  std::ostringstream out;
  out << "{\"mode\": " << json_quote(comm_mode_name(mode)) << ", \"streams\": {";
  for (int s = 0; s < kStreamClassCount; ++s) {
    out << (s ? ", " : "") << json_quote(stream_class_name(kAllStreamClasses[s])) << ": [";
    for (size_t i = 0; i < streams[s].size(); ++i) {
      out << (i ? ", " : "") << "{\"op\": \"" << (streams[s][i].op == Instruction::Op::kRun ? "run" : "wait")
          << "\", \"node\": " << streams[s][i].node << "}";
    }
    out << "]";
  }
  out << "}}";
  return out.str();
}

}  // namespace weft::graph
