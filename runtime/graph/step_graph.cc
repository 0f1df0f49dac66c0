// StepGraph (see step_graph.h): building with cycle checks, program-order topological sort, dumps.
//
// Cycle checks search from the edge's head along dependencies, so adding an edge costs at most one
// walk of the nodes `from` depends on; graphs of a step have thousands of nodes at most.
#include "runtime/graph/step_graph.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>

#include "runtime/error.h"

namespace weft::graph {

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kForward: return "forward";
    case NodeKind::kBackward: return "backward";
    case NodeKind::kCollective: return "collective";
    case NodeKind::kSend: return "send";
    case NodeKind::kRecv: return "recv";
    case NodeKind::kOptimizer: return "optimizer";
    case NodeKind::kOther: return "other";
  }
  return "unknown";
}

const char* stream_class_name(StreamClass stream) {
  switch (stream) {
    case StreamClass::kCompute: return "compute";
    case StreamClass::kTpComm: return "tp_comm";
    case StreamClass::kDpComm: return "dp_comm";
    case StreamClass::kP2p: return "p2p";
  }
  return "unknown";
}

void NodeContext::fire(NodeId signal) const {
  // Outside an executor (a test calling work directly) there is nothing to tell.
  if (fire_ != nullptr) fire_(fire_state_, node_, signal);
}

NodeWork task(std::function<void()> function) {
  return [function = std::move(function)](const NodeContext&) -> CompletionPtr {
    function();
    return nullptr;
  };
}

void StepGraph::check_id(NodeId id, const char* what) const {
  WEFT_CHECK(id >= 0 && id < size(), "StepGraph: ", what, " ", id, " is not a node (the graph has ", size(),
             " nodes)");
}

const Node& StepGraph::node(NodeId id) const {
  check_id(id, "node");
  return nodes_[id];
}

NodeId StepGraph::add_node(NodeSpec spec, const std::vector<NodeId>& dependencies) {
  for (NodeId dependency : dependencies) check_id(dependency, "dependency");
  Node node;
  static_cast<NodeSpec&>(node) = std::move(spec);
  node.id = size();
  nodes_.push_back(std::move(node));
  // Dependencies are existing nodes, so these edges cannot close a cycle.
  for (NodeId dependency : dependencies) add_edge(dependency, nodes_.back().id);
  return nodes_.back().id;
}

NodeId StepGraph::add_signal(std::string name, NodeId producer) {
  check_id(producer, "signal producer");
  WEFT_CHECK(!nodes_[producer].is_signal(), "StepGraph: signal '", name, "' cannot be fired by signal '",
             nodes_[producer].name, "'; give it the signal's producer '",
             nodes_[nodes_[producer].signal_of].name, "'");
  NodeSpec spec;
  spec.kind = NodeKind::kOther;
  spec.name = std::move(name);
  spec.micro_batch = nodes_[producer].micro_batch;
  spec.stream = nodes_[producer].stream;
  const NodeId id = add_node(std::move(spec), {producer});
  nodes_[id].signal_of = producer;
  return id;
}

std::vector<NodeId> StepGraph::path_between(NodeId from, NodeId to) const {
  // Depth-first from `to` backwards along dependencies until `from` is met; parents rebuild the path.
  std::vector<NodeId> parent(nodes_.size(), -1);
  std::vector<char> seen(nodes_.size(), 0);
  std::vector<NodeId> stack = {to};
  seen[to] = 1;
  while (!stack.empty()) {
    const NodeId current = stack.back();
    stack.pop_back();
    if (current == from) {
      std::vector<NodeId> path;  // from, ..., to
      for (NodeId at = from; at != -1; at = parent[at]) path.push_back(at);
      return path;
    }
    for (NodeId dependency : nodes_[current].dependencies) {
      if (seen[dependency]) continue;
      seen[dependency] = 1;
      parent[dependency] = current;  // walking backwards: `dependency` comes before `current`
      stack.push_back(dependency);
    }
  }
  return {};
}

void StepGraph::add_edge(NodeId from, NodeId to) {
  check_id(from, "edge source");
  check_id(to, "edge target");
  Node& target = nodes_[to];
  if (std::find(target.dependencies.begin(), target.dependencies.end(), from) != target.dependencies.end()) {
    return;
  }
  WEFT_CHECK(!target.is_signal(), "StepGraph: signal node '", target.name,
             "' depends only on its producer '", nodes_[target.signal_of].name, "'; cannot add an edge from '",
             nodes_[from].name, "'");
  // A cycle if `from` already depends on `to`: the path to ... from, closed by the new edge from -> to.
  std::vector<NodeId> cycle = from == to ? std::vector<NodeId>{to} : path_between(to, from);
  if (!cycle.empty()) {
    cycle.push_back(to);
    std::ostringstream names;
    for (size_t i = 0; i < cycle.size(); ++i) names << (i ? " -> " : "") << "'" << nodes_[cycle[i]].name << "'";
    WEFT_FAIL("StepGraph: the edge '", nodes_[from].name, "' -> '", nodes_[to].name,
              "' would close the cycle ", names.str());
  }
  target.dependencies.push_back(from);
  nodes_[from].dependents.push_back(to);
  ++edge_count_;
}

std::vector<NodeId> StepGraph::topological_order() const {
  std::vector<int> remaining(nodes_.size());
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<NodeId>> ready;
  for (const Node& node : nodes_) {
    remaining[node.id] = static_cast<int>(node.dependencies.size());
    if (remaining[node.id] == 0) ready.push(node.id);
  }
  std::vector<NodeId> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    const NodeId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (NodeId dependent : nodes_[id].dependents) {
      if (--remaining[dependent] == 0) ready.push(dependent);
    }
  }
  // add_edge keeps the graph acyclic, so every node is reached.
  return order;
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string StepGraph::to_json() const {
  std::ostringstream out;
  out << "{\n  \"streams\": [";
  for (int s = 0; s < kStreamClassCount; ++s) {
    out << (s ? ", " : "") << json_quote(stream_class_name(kAllStreamClasses[s]));
  }
  out << "],\n  \"nodes\": [";
  for (const Node& node : nodes_) {
    out << (node.id ? "," : "") << "\n    {\"id\": " << node.id << ", \"name\": " << json_quote(node.name)
        << ", \"kind\": " << json_quote(node_kind_name(node.kind)) << ", \"micro_batch\": " << node.micro_batch
        << ", \"stream\": " << json_quote(stream_class_name(node.stream)) << ", \"bytes\": " << node.bytes
        << ", \"dependencies\": [";
    for (size_t i = 0; i < node.dependencies.size(); ++i) out << (i ? ", " : "") << node.dependencies[i];
    out << "]";
    if (node.is_signal()) out << ", \"signal_of\": " << node.signal_of;
    if (node.peer >= 0) out << ", \"peer\": " << node.peer << ", \"tag\": " << node.tag;
    if (node.blocks_host) out << ", \"blocks_host\": true";
    out << "}";
  }
  out << "\n  ],\n  \"edges\": [";
  bool first = true;
  for (const Node& node : nodes_) {
    for (NodeId dependency : node.dependencies) {
      out << (first ? "" : ",") << "\n    {\"from\": " << dependency << ", \"to\": " << node.id << "}";
      first = false;
    }
  }
  out << "\n  ]\n}\n";
  return out.str();
}

namespace {

// DOT double-quoted string: quotes and backslashes escaped, newlines as \n.
std::string dot_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  out += '"';
  return out;
}

const char* dot_shape(const Node& node) {
  if (node.is_signal()) return "point";
  switch (node.kind) {
    case NodeKind::kForward:
    case NodeKind::kBackward: return "box";
    case NodeKind::kCollective: return "ellipse";
    case NodeKind::kSend:
    case NodeKind::kRecv: return "cds";
    case NodeKind::kOptimizer: return "box3d";
    case NodeKind::kOther: return "diamond";
  }
  return "box";
}

const char* dot_color(NodeKind kind) {
  switch (kind) {
    case NodeKind::kForward: return "#cfe2ff";
    case NodeKind::kBackward: return "#ffe5b4";
    case NodeKind::kCollective: return "#d4edda";
    case NodeKind::kSend:
    case NodeKind::kRecv: return "#e2d9f3";
    case NodeKind::kOptimizer: return "#f8d7da";
    case NodeKind::kOther: return "#eeeeee";
  }
  return "#ffffff";
}

}  // namespace

std::string StepGraph::to_dot() const {
  std::ostringstream out;
  out << "digraph step {\n  rankdir=LR;\n  node [style=filled, fontname=\"Helvetica\"];\n";
  for (StreamClass stream : kAllStreamClasses) {
    bool any = false;
    for (const Node& node : nodes_) any = any || node.stream == stream;
    if (!any) continue;
    out << "  subgraph cluster_" << stream_class_name(stream) << " {\n    label=" << dot_quote(stream_class_name(stream))
        << ";\n";
    for (const Node& node : nodes_) {
      if (node.stream != stream) continue;
      std::string label = node.name;
      if (node.bytes > 0) label += "\n" + std::to_string(node.bytes) + " B";
      out << "    n" << node.id << " [label=" << dot_quote(label) << ", shape=" << dot_shape(node)
          << ", fillcolor=" << dot_quote(dot_color(node.kind)) << "];\n";
    }
    out << "  }\n";
  }
  for (const Node& node : nodes_) {
    for (NodeId dependency : node.dependencies) out << "  n" << dependency << " -> n" << node.id << ";\n";
  }
  out << "}\n";
  return out.str();
}

void write_graph(const StepGraph& graph, const std::string& path) {
  auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  std::string text;
  if (ends_with(".json")) {
    text = graph.to_json();
  } else if (ends_with(".dot") || ends_with(".gv")) {
    text = graph.to_dot();
  } else {
    WEFT_FAIL("log.graph_file '", path, "': unknown extension; use .json (JSON) or .dot/.gv (Graphviz DOT)");
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  WEFT_CHECK(file.good(), "log.graph_file: cannot open '", path, "' for writing");
  file << text;
  file.close();
  WEFT_CHECK(!file.fail(), "log.graph_file: writing '", path, "' failed");
}

}  // namespace weft::graph
