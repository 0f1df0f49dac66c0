// StepTimeline: interval-union arithmetic on synthetic intervals, the derived step metrics, and the
// Chrome trace (valid JSON, one thread per stream, every node).
#include "runtime/graph/step_timeline.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace weft::graph {
namespace {

TEST(Intervals, UnionLength) {
  EXPECT_DOUBLE_EQ(union_length({}), 0.0);
  EXPECT_DOUBLE_EQ(union_length({{0, 10}}), 10.0);
  EXPECT_DOUBLE_EQ(union_length({{0, 10}, {20, 25}}), 15.0);         // disjoint
  EXPECT_DOUBLE_EQ(union_length({{0, 10}, {5, 15}}), 15.0);          // overlapping
  EXPECT_DOUBLE_EQ(union_length({{0, 10}, {10, 15}}), 15.0);         // touching
  EXPECT_DOUBLE_EQ(union_length({{0, 30}, {5, 10}, {12, 20}}), 30.0);  // nested
  EXPECT_DOUBLE_EQ(union_length({{20, 25}, {0, 10}, {8, 21}}), 25.0);  // unsorted chain
  EXPECT_DOUBLE_EQ(union_length({{5, 5}, {7, 3}}), 0.0);              // empty and reversed
}

TEST(Intervals, UncoveredLength) {
  // comm [0,100]; compute [0,50]: half of it exposed.
  EXPECT_DOUBLE_EQ(uncovered_length({{0, 100}}, {{0, 50}}), 50.0);
  // fully covered
  EXPECT_DOUBLE_EQ(uncovered_length({{10, 20}}, {{0, 50}}), 0.0);
  // nothing covers
  EXPECT_DOUBLE_EQ(uncovered_length({{10, 20}, {30, 35}}, {}), 15.0);
  // holes in the cover, overlapping comm intervals
  EXPECT_DOUBLE_EQ(uncovered_length({{0, 40}, {30, 60}}, {{5, 10}, {20, 50}}), 60.0 - 5.0 - 30.0);
  // cover outside the intervals does not count
  EXPECT_DOUBLE_EQ(uncovered_length({{0, 10}}, {{20, 100}}), 10.0);
}

NodeTiming timing(NodeId id, std::string name, NodeKind kind, StreamClass stream, double start, double end) {
  NodeTiming t;
  t.node = id;
  t.name = std::move(name);
  t.kind = kind;
  t.stream = stream;
  t.start_ms = start;
  t.end_ms = end;
  return t;
}

TEST(StepTimeline, Metrics) {
  StepTimeline timeline;
  timeline.nodes = {
      timing(0, "forward", NodeKind::kForward, StreamClass::kCompute, 0, 30),
      timing(1, "backward", NodeKind::kBackward, StreamClass::kCompute, 30, 70),
      timing(2, "all_reduce 1", NodeKind::kCollective, StreamClass::kDpComm, 50, 90),  // 20 exposed
      timing(3, "all_gather", NodeKind::kCollective, StreamClass::kTpComm, 10, 20),    // hidden
      timing(4, "optimizer", NodeKind::kOptimizer, StreamClass::kCompute, 90, 100),
  };
  timeline.step_ms = 100;
  timeline.compute_metrics();
  EXPECT_DOUBLE_EQ(timeline.compute_ms, 80.0);
  EXPECT_DOUBLE_EQ(timeline.comm_ms, 50.0);
  EXPECT_DOUBLE_EQ(timeline.exposed_comm_ms, 20.0);
  EXPECT_DOUBLE_EQ(timeline.overlap_ratio, 1.0 - 20.0 / 50.0);

  StepTimeline quiet;
  quiet.nodes = {timing(0, "forward", NodeKind::kForward, StreamClass::kCompute, 0, 5)};
  quiet.compute_metrics();
  EXPECT_DOUBLE_EQ(quiet.comm_ms, 0.0);
  EXPECT_DOUBLE_EQ(quiet.overlap_ratio, 0.0);
}

TEST(StepTimeline, ChromeTrace) {
  StepTimeline timeline;
  timeline.nodes = {timing(0, "forward \"mb0\"", NodeKind::kForward, StreamClass::kCompute, 0, 1.5),
                    timing(1, "all_reduce", NodeKind::kCollective, StreamClass::kDpComm, 1, 2)};
  NodeTiming signal = timing(2, "bucket ready", NodeKind::kOther, StreamClass::kCompute, 1.2, 1.2);
  signal.signal = true;
  timeline.nodes.push_back(signal);
  timeline.step_ms = 2;
  timeline.compute_metrics();
  const nlohmann::json trace = nlohmann::json::parse(timeline.to_chrome_trace_json(3, "", 10.0));
  int complete = 0;
  int instant = 0;
  std::map<int, std::string> threads;
  for (const auto& event : trace["traceEvents"]) {
    EXPECT_EQ(event["pid"], 3);
    if (event["ph"] == "M" && event["name"] == "thread_name") threads[event["tid"]] = event["args"]["name"];
    if (event["ph"] == "X") {
      ++complete;
      if (event["name"] == "all_reduce") {
        EXPECT_EQ(event["tid"], static_cast<int>(StreamClass::kDpComm));
        EXPECT_DOUBLE_EQ(event["ts"].get<double>(), 11000.0);  // microseconds, offset by 10 ms
        EXPECT_DOUBLE_EQ(event["dur"].get<double>(), 1000.0);
        EXPECT_EQ(event["cat"], "collective");
      }
    }
    if (event["ph"] == "i") ++instant;
  }
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(instant, 1);
  EXPECT_EQ(threads[0], "compute");
  EXPECT_EQ(threads[2], "dp_comm");
  EXPECT_DOUBLE_EQ(trace["otherData"]["exposed_comm_ms"].get<double>(), timeline.exposed_comm_ms);
}

}  // namespace
}  // namespace weft::graph
