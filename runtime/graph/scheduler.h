// Scheduler: lowers a StepGraph under a comm mode to an ExecutionPlan, one ordered list per stream.
//
// A list is what one stream does, in order: `run n` (issue node n's work on this stream) and
// `wait n` (this stream goes no further until node n, run on another stream, is complete). Stream
// order is completion order: on CUDA a stream finishes its work in order, and the CPU executor
// waits for each node's Completion before the stream's next instruction, so a dependency on an
// earlier node of the same list needs no wait.
//
// Comm modes:
// - manual (the hand-written baseline): one list. Every node, collectives included, runs on the
//   compute stream in program order (a topological order that follows insertion order), so
//   compute waits for each collective at once and nothing overlaps.
// - auto: each node runs on its own stream class, every list in the same program order, and a
//   stream waits for another stream's node only where a dependency requires it. Data-parallel
//   buckets then reduce while backward goes on, wherever the graph says later backward work does
//   not depend on them. A later issue replaces the auto-mode section of scheduler.cc (reordering,
//   priorities, chunking, the cost model) without changing the plan's shape.
//
// Invariants of every plan (validate_plan checks them):
// - each node is run exactly once, on exactly one list;
// - each dependency of a node is earlier on the node's list or waited for on that list before it;
// - all lists follow one topological order, so the plan cannot deadlock.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/graph/step_graph.h"

namespace weft::graph {

enum class CommMode : uint8_t { kManual, kAuto };
// "manual", "auto".
const char* comm_mode_name(CommMode mode);
// Parses "manual" or "auto"; throws weft::Error naming the choices otherwise.
CommMode parse_comm_mode(std::string_view text);

struct Instruction {
  enum class Op : uint8_t { kRun, kWait };
  Op op = Op::kRun;
  NodeId node = -1;
  bool operator==(const Instruction&) const = default;
};

struct ExecutionPlan {
  CommMode mode = CommMode::kManual;
  // streams[s]: what stream class s does, in order (indexed by static_cast<int>(StreamClass)).
  std::array<std::vector<Instruction>, kStreamClassCount> streams;
  // Per node: the stream it runs on (differs from Node::stream for collectives in manual mode).
  std::vector<StreamClass> stream_of;
  // The topological order every list follows.
  std::vector<NodeId> order;

  const std::vector<Instruction>& list(StreamClass stream) const { return streams[static_cast<int>(stream)]; }
  std::vector<Instruction>& list(StreamClass stream) { return streams[static_cast<int>(stream)]; }
  // One line per stream: "compute: run 'forward mb0'; wait 'all_reduce bucket 1'; ...".
  std::string to_string(const StepGraph& graph) const;
  // {"mode": ..., "streams": {"compute": [{"op": "run", "node": 0}, ...], ...}}.
  std::string to_json() const;
};

// An ordering policy: the topological order every list of a plan follows. Pipeline schedules
// (GPipe, 1F1B, interleaved) are policies over the same graph. A policy must return every node once,
// dependencies first; plan() checks it.
using OrderingPolicy = std::function<std::vector<NodeId>(const StepGraph&)>;
// Program order: among ready nodes the earliest added first (StepGraph::topological_order).
std::vector<NodeId> program_order(const StepGraph& graph);

class Scheduler {
 public:
  // `mode` places nodes on streams; `ordering` orders them.
  static ExecutionPlan plan(const StepGraph& graph, CommMode mode, const OrderingPolicy& ordering = program_order);
};

// Throws weft::Error naming the node and the missing order if `plan` breaks an invariant above
// for `graph`.
void validate_plan(const StepGraph& graph, const ExecutionPlan& plan);

}  // namespace weft::graph
