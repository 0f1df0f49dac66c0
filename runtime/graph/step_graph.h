// StepGraph: every piece of work of one optimizer step, with its dependencies.
//
// A node is one task: the forward or backward of a stage (or a layer) for one micro-batch, a
// collective, a pipeline send or recv, the optimizer update. It carries a kind, a name ("forward
// mb0", "all_reduce bucket 3"), its micro-batch (-1 when step-wide), the stream class it belongs on
// (compute, tp_comm, dp_comm, p2p), the bytes it moves (collectives) and its work: a callable that
// the executor calls once per step. Work that finishes later than its call (a queued collective)
// returns a Completion (runtime/completion.h; a parallel/ CollectiveHandle is one, returned as it
// is); work that is done when it returns returns nullptr.
//
// The graph knows nothing of what the work is: what a collective node runs is a callable built by
// parallel/ code, so runtime/ depends on no layer above it. The Scheduler (scheduler.h) lowers a
// graph to per-stream lists under a comm mode; the Executor (executor.h) runs them.
//
// Invariants:
// - Node ids are dense, 0.. size()-1, in insertion order, which is the "program order" that the
//   manual comm mode follows.
// - The graph is acyclic at all times: an edge that would close a cycle is refused with a
//   weft::Error that names the cycle, and the graph is left unchanged.
// - Edge from -> to means: `to` starts only after `from` is complete. Duplicate edges are ignored.
// - A signal node (add_signal) stands for a point inside its producer's work ("bucket 3's gradients
//   are ready", fired by a grad hook during backward): the producer's work calls ctx.fire(signal)
//   when the point is reached, and nodes that depend on the signal may start then, before the
//   producer ends. A signal not fired by the time its producer completes is fired then. A signal
//   has no work and no dependency other than its producer.
//
// Example (data-parallel step, two micro-batches, two gradient buckets):
//   StepGraph g;
//   NodeId f0 = g.add_node({.kind = NodeKind::kForward, .name = "forward mb0", .micro_batch = 0,
//                           .work = task([&] { ... })});
//   NodeId b0 = g.add_node({.kind = NodeKind::kBackward, .name = "backward mb0", ...}, {f0});
//   ...
//   NodeId ready1 = g.add_signal("bucket 1 ready", b1);     // fired from b1's grad hook
//   NodeId ar1 = g.add_node({.kind = NodeKind::kCollective, .name = "all_reduce bucket 1",
//                            .stream = StreamClass::kDpComm, .bytes = ..., .work = ...}, {ready1});
//   g.add_node({.kind = NodeKind::kOptimizer, .name = "optimizer", .work = ...}, {ar0, ar1});
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.h"
#include "runtime/completion.h"

// cudaStream_t is `CUstream_st*`; naming the struct keeps this header free of CUDA headers.
struct CUstream_st;

namespace weft::graph {

using NodeId = int32_t;

enum class NodeKind : uint8_t { kForward, kBackward, kCollective, kSend, kRecv, kOptimizer, kOther };
constexpr int kNodeKindCount = 7;
// "forward", "backward", "collective", "send", "recv", "optimizer", "other".
const char* node_kind_name(NodeKind kind);
// Collectives, sends and receives: the nodes whose time counts as communication.
inline bool is_communication(NodeKind kind) {
  return kind == NodeKind::kCollective || kind == NodeKind::kSend || kind == NodeKind::kRecv;
}

// The streams of a step. On CUDA each is a cudaStream_t; on the CPU, compute is the caller's thread
// and each communication class is a thread of the executor.
enum class StreamClass : uint8_t { kCompute, kTpComm, kDpComm, kP2p };
constexpr int kStreamClassCount = 4;
// "compute", "tp_comm", "dp_comm", "p2p".
const char* stream_class_name(StreamClass stream);
inline constexpr std::array<StreamClass, kStreamClassCount> kAllStreamClasses = {
    StreamClass::kCompute, StreamClass::kTpComm, StreamClass::kDpComm, StreamClass::kP2p};

// What a node's work is told when it runs. Made by the executor.
class NodeContext {
 public:
  using FireFunction = void (*)(void* state, NodeId producer, NodeId signal);

  NodeContext(NodeId node, StreamClass stream, Device device, CUstream_st* cuda_stream,
              FireFunction fire = nullptr, void* fire_state = nullptr)
      : node_(node), stream_(stream), device_(device), cuda_stream_(cuda_stream), fire_(fire),
        fire_state_(fire_state) {}

  // The node being run.
  NodeId node() const { return node_; }
  // The stream it runs on (a collective runs on compute in the manual comm mode).
  StreamClass stream() const { return stream_; }
  // cpu, or the CUDA device whose streams the executor drives.
  Device device() const { return device_; }
  // CUDA: the stream (a cudaStream_t) to enqueue the work on; it is also the thread's current
  // stream of device() while the work runs. nullptr on the CPU.
  CUstream_st* cuda_stream() const { return cuda_stream_; }
  // Completes signal node `signal` now (see add_signal); `signal`'s producer must be this node.
  // Firing twice is harmless. On CUDA, work enqueued on cuda_stream() before the call is what
  // dependents of the signal are ordered after.
  void fire(NodeId signal) const;

 private:
  NodeId node_;
  StreamClass stream_;
  Device device_;
  CUstream_st* cuda_stream_;
  FireFunction fire_;
  void* fire_state_;
};

// A node's work: issues it and returns its completion (nullptr when done on return).
using NodeWork = std::function<CompletionPtr(const NodeContext&)>;
// Work that is done when `function` returns.
NodeWork task(std::function<void()> function);

struct NodeSpec {
  NodeKind kind = NodeKind::kOther;
  std::string name;                         // unique names make dumps readable; not enforced
  int micro_batch = -1;                     // -1: step-wide (optimizer, a step-wide collective)
  StreamClass stream = StreamClass::kCompute;
  int64_t bytes = 0;                        // bytes this rank contributes (collectives, send/recv)
  NodeWork work;                            // may be empty: a node that only orders others
  // Sends and recvs: the peer (a pipeline stage, the group rank of the peer) and the message's tag,
  // so that a plan's point-to-point pairs can be matched across ranks without running it; -1 otherwise.
  int peer = -1;
  int64_t tag = -1;
  // The work waits on the host for another rank (a pipeline receive: an MPI wait, then the copy to
  // the device). The CUDA executor calls it on a thread of its own, so that the one thread issuing
  // every stream's list is never held by it (executor.h); the CPU executor gives each comm list a
  // thread anyway. Ordering is unchanged: the node's list still waits for it, and so do its dependents.
  bool blocks_host = false;
};

struct Node : NodeSpec {
  NodeId id = -1;
  NodeId signal_of = -1;                    // the producer, for a signal node; -1 otherwise
  std::vector<NodeId> dependencies;         // nodes this one waits for, in the order added
  std::vector<NodeId> dependents;           // nodes that wait for this one
  bool is_signal() const { return signal_of >= 0; }
};

class StepGraph {
 public:
  // Adds a node after every existing one (program order) that depends on `dependencies` (existing
  // nodes). Throws weft::Error for an unknown dependency.
  NodeId add_node(NodeSpec spec, const std::vector<NodeId>& dependencies = {});
  // A signal node fired by `producer`'s work (see the file comment); same stream as the producer.
  NodeId add_signal(std::string name, NodeId producer);
  // `to` depends on `from`. Throws weft::Error naming the cycle if `from` already depends on `to`
  // (directly or not), or if `to` is a signal node.
  void add_edge(NodeId from, NodeId to);

  int size() const { return static_cast<int>(nodes_.size()); }
  bool empty() const { return nodes_.empty(); }
  const Node& node(NodeId id) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  int edge_count() const { return edge_count_; }

  // Every node once, dependencies first; among ready nodes the earliest added first (program order).
  std::vector<NodeId> topological_order() const;

  // {"streams": [...], "nodes": [{id, name, kind, micro_batch, stream, bytes, dependencies,
  // signal_of?, peer? and tag?, blocks_host?}], "edges": [{"from", "to"}]}.
  std::string to_json() const;
  // Graphviz: one cluster per stream class, nodes shaped by kind, an edge per dependency.
  std::string to_dot() const;

 private:
  void check_id(NodeId id, const char* what) const;
  // The dependency path from `from` to `to` (from first) if `to` depends on `from`; empty if not.
  std::vector<NodeId> path_between(NodeId from, NodeId to) const;

  std::vector<Node> nodes_;
  int edge_count_ = 0;
};

// Writes `graph` to `path`: JSON for ".json", Graphviz DOT for ".dot" or ".gv". Throws weft::Error
// for any other extension or when the file cannot be written. (`log.graph_file` ends here.)
void write_graph(const StepGraph& graph, const std::string& path);

// JSON string literal of `text` (quotes included), shared by the graph, plan and timeline dumps.
std::string json_quote(std::string_view text);

}  // namespace weft::graph
