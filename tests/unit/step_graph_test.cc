// StepGraph: building, program order, cycle detection (the error names the cycle), signal nodes,
// and the JSON / DOT dumps (every node and every edge present; JSON parsed back).
#include "runtime/graph/step_graph.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "runtime/error.h"

namespace weft::graph {
namespace {

NodeSpec spec(NodeKind kind, std::string name, int micro_batch = -1, StreamClass stream = StreamClass::kCompute,
              int64_t bytes = 0) {
  NodeSpec s;
  s.kind = kind;
  s.name = std::move(name);
  s.micro_batch = micro_batch;
  s.stream = stream;
  s.bytes = bytes;
  return s;
}

// forward mb0 -> backward mb0 -> all_reduce bucket 0 -> optimizer, plus a parallel tp collective.
StepGraph small_graph() {
  StepGraph g;
  const NodeId f = g.add_node(spec(NodeKind::kForward, "forward mb0", 0));
  const NodeId tp = g.add_node(spec(NodeKind::kCollective, "all_gather \"qkv\"", 0, StreamClass::kTpComm, 4096), {f});
  const NodeId b = g.add_node(spec(NodeKind::kBackward, "backward mb0", 0), {tp});
  const NodeId ar = g.add_node(spec(NodeKind::kCollective, "all_reduce bucket 0", -1, StreamClass::kDpComm, 1 << 20), {b});
  g.add_node(spec(NodeKind::kOptimizer, "optimizer"), {ar});
  return g;
}

TEST(StepGraph, BuildsNodesAndEdges) {
  StepGraph g = small_graph();
  ASSERT_EQ(g.size(), 5);
  EXPECT_EQ(g.edge_count(), 4);
  EXPECT_EQ(g.node(0).name, "forward mb0");
  EXPECT_EQ(g.node(0).micro_batch, 0);
  EXPECT_EQ(g.node(3).kind, NodeKind::kCollective);
  EXPECT_EQ(g.node(3).stream, StreamClass::kDpComm);
  EXPECT_EQ(g.node(3).bytes, 1 << 20);
  EXPECT_EQ(g.node(3).dependencies, std::vector<NodeId>{2});
  EXPECT_EQ(g.node(2).dependents, std::vector<NodeId>{3});
  // A duplicate edge is ignored.
  g.add_edge(2, 3);
  EXPECT_EQ(g.edge_count(), 4);
  EXPECT_THROW(g.add_node(spec(NodeKind::kOther, "x"), {42}), weft::Error);
  EXPECT_THROW(g.node(-1), weft::Error);
}

TEST(StepGraph, NamesOfKindsAndStreams) {
  EXPECT_STREQ(node_kind_name(NodeKind::kForward), "forward");
  EXPECT_STREQ(node_kind_name(NodeKind::kRecv), "recv");
  EXPECT_STREQ(stream_class_name(StreamClass::kTpComm), "tp_comm");
  EXPECT_STREQ(stream_class_name(StreamClass::kP2p), "p2p");
  EXPECT_TRUE(is_communication(NodeKind::kSend));
  EXPECT_FALSE(is_communication(NodeKind::kOptimizer));
}

TEST(StepGraph, TopologicalOrderFollowsProgramOrder) {
  StepGraph g;
  for (int i = 0; i < 6; ++i) g.add_node(spec(NodeKind::kOther, "n" + std::to_string(i)));
  // Independent nodes keep insertion order; an edge pointing backwards in insertion order moves
  // its target after its source and nothing else.
  g.add_edge(4, 1);
  EXPECT_EQ(g.topological_order(), (std::vector<NodeId>{0, 2, 3, 4, 1, 5}));
  EXPECT_EQ(small_graph().topological_order(), (std::vector<NodeId>{0, 1, 2, 3, 4}));
}

TEST(StepGraph, CycleIsRefusedAndNamed) {
  StepGraph g;
  const NodeId a = g.add_node(spec(NodeKind::kForward, "a"));
  const NodeId b = g.add_node(spec(NodeKind::kForward, "b"), {a});
  const NodeId c = g.add_node(spec(NodeKind::kForward, "c"), {b});
  try {
    g.add_edge(c, a);
    FAIL() << "the cycle was not detected";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("'a' -> 'b' -> 'c' -> 'a'"), std::string::npos) << error.what();
  }
  // The graph is unchanged, and still acyclic.
  EXPECT_EQ(g.edge_count(), 2);
  EXPECT_TRUE(g.node(a).dependencies.empty());
  EXPECT_EQ(g.topological_order().size(), 3u);
  try {
    g.add_edge(b, b);
    FAIL() << "the self edge was not detected";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("'b' -> 'b'"), std::string::npos) << error.what();
  }
  // A longer way round through a side branch.
  const NodeId d = g.add_node(spec(NodeKind::kOther, "d"), {a});
  g.add_edge(d, c);
  EXPECT_THROW(g.add_edge(c, d), weft::Error);
  EXPECT_NO_THROW(g.add_edge(b, d));
}

TEST(StepGraph, SignalNodes) {
  StepGraph g;
  const NodeId b = g.add_node(spec(NodeKind::kBackward, "backward mb1", 1, StreamClass::kCompute));
  const NodeId ready = g.add_signal("bucket 0 ready", b);
  EXPECT_TRUE(g.node(ready).is_signal());
  EXPECT_EQ(g.node(ready).signal_of, b);
  EXPECT_EQ(g.node(ready).stream, StreamClass::kCompute);
  EXPECT_EQ(g.node(ready).micro_batch, 1);
  EXPECT_EQ(g.node(ready).dependencies, std::vector<NodeId>{b});
  const NodeId other = g.add_node(spec(NodeKind::kOther, "other"));
  EXPECT_THROW(g.add_edge(other, ready), weft::Error);  // a signal depends only on its producer
  EXPECT_THROW(g.add_signal("signal of a signal", ready), weft::Error);
  const NodeId ar = g.add_node(spec(NodeKind::kCollective, "all_reduce bucket 0", -1, StreamClass::kDpComm), {ready});
  EXPECT_EQ(g.node(ar).dependencies, std::vector<NodeId>{ready});
}

TEST(StepGraph, JsonHasEveryNodeAndEdge) {
  StepGraph g = small_graph();
  g.add_signal("bucket ready", 2);
  const nlohmann::json json = nlohmann::json::parse(g.to_json());
  ASSERT_EQ(json["nodes"].size(), static_cast<size_t>(g.size()));
  for (const Node& node : g.nodes()) {
    const auto& entry = json["nodes"][node.id];
    EXPECT_EQ(entry["id"], node.id);
    EXPECT_EQ(entry["name"], node.name);  // includes the escaped quotes of "qkv"
    EXPECT_EQ(entry["kind"], node_kind_name(node.kind));
    EXPECT_EQ(entry["stream"], stream_class_name(node.stream));
    EXPECT_EQ(entry["micro_batch"], node.micro_batch);
    EXPECT_EQ(entry["bytes"], node.bytes);
    EXPECT_EQ(entry["dependencies"].get<std::vector<NodeId>>(), node.dependencies);
    EXPECT_EQ(entry.contains("signal_of"), node.is_signal());
  }
  std::set<std::pair<NodeId, NodeId>> edges;
  for (const auto& edge : json["edges"]) edges.insert({edge["from"].get<NodeId>(), edge["to"].get<NodeId>()});
  ASSERT_EQ(edges.size(), static_cast<size_t>(g.edge_count()));
  for (const Node& node : g.nodes()) {
    for (NodeId dependency : node.dependencies) EXPECT_TRUE(edges.count({dependency, node.id}));
  }
  EXPECT_EQ(json["streams"].get<std::vector<std::string>>(),
            (std::vector<std::string>{"compute", "tp_comm", "dp_comm", "p2p"}));
}

TEST(StepGraph, DotHasEveryNodeEdgeAndOneClusterPerStream) {
  StepGraph g = small_graph();
  const std::string dot = g.to_dot();
  EXPECT_EQ(dot.rfind("digraph step {", 0), 0u);
  for (const Node& node : g.nodes()) {
    EXPECT_NE(dot.find("n" + std::to_string(node.id) + " [label="), std::string::npos) << node.name;
    for (NodeId dependency : node.dependencies) {
      EXPECT_NE(dot.find("n" + std::to_string(dependency) + " -> n" + std::to_string(node.id) + ";"),
                std::string::npos);
    }
  }
  EXPECT_NE(dot.find("all_gather \\\"qkv\\\""), std::string::npos);  // quotes escaped for DOT
  EXPECT_NE(dot.find("subgraph cluster_compute"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_tp_comm"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_dp_comm"), std::string::npos);
  EXPECT_EQ(dot.find("subgraph cluster_p2p"), std::string::npos);  // no node on it
}

TEST(StepGraph, WriteGraphChoosesFormatByExtension) {
  const StepGraph g = small_graph();
  const auto directory = std::filesystem::temp_directory_path() / ("weft_graph_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  auto read = [](const std::filesystem::path& path) {
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  };
  write_graph(g, (directory / "step.json").string());
  write_graph(g, (directory / "step.dot").string());
  EXPECT_EQ(read(directory / "step.json"), g.to_json());
  EXPECT_EQ(read(directory / "step.dot"), g.to_dot());
  try {
    write_graph(g, (directory / "step.txt").string());
    FAIL() << "an unknown extension was accepted";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find(".json"), std::string::npos);
  }
  EXPECT_THROW(write_graph(g, (directory / "missing" / "step.json").string()), weft::Error);
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace weft::graph
