// Timeline picture: reading a trace as log.trace_file writes it (streams from the metadata, step
// markers, everything else skipped), cutting out one step with times from its start, colour
// classes, the exposed intervals, and the SVG: one rectangle per event, exposed bands exactly as
// wide as the uncovered time, one scale for every panel, escaped names, balanced tags; a damaged
// file is a weft::Error that names it.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "launcher/timeline_picture.h"
#include "runtime/error.h"
#include "runtime/graph/step_timeline.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

class TimelinePictureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (fs::temp_directory_path() /
             ("weft_timeline_picture_test_" + std::to_string(::getpid()) + "_" + info->name() + ".json"))
                .string();
  }
  void TearDown() override { fs::remove(path_); }

  void write(const std::string& text) {
    std::ofstream file(path_);
    file << text;
  }

  std::string path_;
};

// Two ranks, two steps each, in the shape data_parallel_strategy.cc writes (metadata repeated per
// step), plus what the reader must skip: a signal, a counter, a sort index. Rank 1's thread names
// come after its first events, and one event is on a thread nobody named.
constexpr const char* kTrace = R"({"traceEvents": [
{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "compute"}},
{"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}},
{"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "dp_comm"}},
{"name": "forward block 0", "cat": "forward", "pid": 0, "tid": 0, "ts": 1000.5, "ph": "X", "dur": 2000, "args": {"node": 0, "micro_batch": 0, "bytes": 0}},
{"name": "all_reduce bucket 0", "cat": "collective", "pid": 0, "tid": 2, "ts": 2500, "ph": "X", "dur": 3000, "args": {"node": 1, "micro_batch": -1, "bytes": 64}},
{"name": "bucket 0 ready", "cat": "other", "pid": 0, "tid": 0, "ts": 2400, "ph": "i", "s": "t", "args": {"node": 2, "micro_batch": -1, "bytes": 0}},
{"ph": "i", "s": "p", "cat": "step", "name": "step 1", "pid": 0, "tid": 0, "ts": 1000, "args": {"step": 1, "step_ms": 9.0}},
{"name": "backward block 0", "cat": "backward", "pid": 1, "tid": 0, "ts": 1600, "ph": "X", "dur": 1000, "args": {}},
{"name": "mystery", "cat": "other", "pid": 1, "tid": 7, "ts": 1700, "ph": "X", "dur": 100, "args": {}},
{"ph": "i", "s": "p", "cat": "step", "name": "step 1", "pid": 1, "tid": 0, "ts": 1500, "args": {"step": 1, "step_ms": 9.0}},
{"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "compute"}},
{"ph": "C", "name": "pipeline bubble", "pid": 0, "ts": 1000, "args": {"measured": 0.1, "theory": 0.2}},
{"name": "optimizer", "cat": "optimizer", "pid": 0, "tid": 0, "ts": 11500, "ph": "X", "dur": 500, "args": {}},
{"name": "reduce_scatter bucket 1", "cat": "collective", "pid": 0, "tid": 2, "ts": 11800, "ph": "X", "dur": 700, "args": {}},
{"ph": "i", "s": "p", "cat": "step", "name": "step 2", "pid": 0, "tid": 0, "ts": 11000, "args": {"step": 2, "step_ms": 2.0}},
{"name": "forward block 0", "cat": "forward", "pid": 1, "tid": 0, "ts": 11300, "ph": "X", "dur": 400, "args": {}},
{"ph": "i", "s": "p", "cat": "step", "name": "step 2", "pid": 1, "tid": 0, "ts": 11200, "args": {"step": 2, "step_ms": 2.0}}
]})";

TEST_F(TimelinePictureTest, ReadsEventsStreamsAndStepMarkers) {
  write(kTrace);
  const Trace trace = read_chrome_trace(path_);

  ASSERT_EQ(trace.events.size(), 7u);  // the complete events only, in the file's order
  const TraceEvent& forward = trace.events[0];
  EXPECT_EQ(forward.rank, 0);
  EXPECT_EQ(forward.stream, "compute");
  EXPECT_EQ(forward.category, "forward");
  EXPECT_EQ(forward.name, "forward block 0");
  EXPECT_DOUBLE_EQ(forward.start_ms, 1.0005);
  EXPECT_DOUBLE_EQ(forward.end_ms, 3.0005);
  EXPECT_EQ(trace.events[1].stream, "dp_comm");
  EXPECT_EQ(trace.events[1].category, "collective");
  EXPECT_EQ(trace.events[2].stream, "compute");  // named by metadata that comes later in the file
  EXPECT_EQ(trace.events[2].rank, 1);
  EXPECT_EQ(trace.events[3].stream, "stream 7");

  // Sorted by rank, then time.
  ASSERT_EQ(trace.steps.size(), 4u);
  EXPECT_EQ(trace.steps[0].rank, 0);
  EXPECT_EQ(trace.steps[0].step, 1);
  EXPECT_DOUBLE_EQ(trace.steps[0].start_ms, 1.0);
  EXPECT_EQ(trace.steps[1].rank, 0);
  EXPECT_EQ(trace.steps[1].step, 2);
  EXPECT_EQ(trace.steps[2].rank, 1);
  EXPECT_EQ(trace.steps[2].step, 1);
  EXPECT_DOUBLE_EQ(trace.steps[3].start_ms, 11.2);
}

TEST_F(TimelinePictureTest, EventsOfStepTakeEachRanksWindowFromTheEarliestMarker) {
  write(kTrace);
  const Trace trace = read_chrome_trace(path_);

  // Step 1: each rank up to its own step 2 marker; times from rank 0's marker at 1.0 ms.
  const std::vector<TraceEvent> first = events_of_step(trace, 1);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first[0].name, "forward block 0");
  EXPECT_NEAR(first[0].start_ms, 0.0005, 1e-12);
  EXPECT_NEAR(first[1].start_ms, 1.5, 1e-12);  // all_reduce bucket 0 at 2.5 ms
  EXPECT_NEAR(first[1].end_ms, 4.5, 1e-12);
  EXPECT_EQ(first[2].rank, 1);
  EXPECT_NEAR(first[2].start_ms, 0.6, 1e-12);  // rank 1's own marker is later; the origin is not

  // Step 2, the last: up to the end of the trace; the origin is rank 0's marker at 11.0 ms.
  const std::vector<TraceEvent> second = events_of_step(trace, 2);
  ASSERT_EQ(second.size(), 3u);
  EXPECT_EQ(second[0].name, "optimizer");
  EXPECT_NEAR(second[0].start_ms, 0.5, 1e-12);
  EXPECT_NEAR(second[1].end_ms, 1.5, 1e-12);
  EXPECT_EQ(second[2].rank, 1);
  EXPECT_NEAR(second[2].start_ms, 0.3, 1e-12);

  EXPECT_TRUE(events_of_step(trace, 3).empty());
}

TEST(TimelinePicture, ColourClassesFollowTheCategoryAndTheCollectivesFirstWord) {
  auto colour = [](const std::string& category, const std::string& name) {
    TraceEvent event;
    event.category = category;
    event.name = name;
    return event_colour_class(event);
  };
  EXPECT_EQ(colour("forward", "forward block 0"), "compute");
  EXPECT_EQ(colour("backward", "backward block 1"), "compute");
  EXPECT_EQ(colour("optimizer", "optimizer"), "compute");
  EXPECT_EQ(colour("other", "loss"), "compute");
  EXPECT_EQ(colour("collective", "all_reduce bucket 3"), "all_reduce");
  EXPECT_EQ(colour("collective", "all_reduce loss"), "all_reduce");
  EXPECT_EQ(colour("collective", "all_reduce(sum) on tp"), "all_reduce");
  EXPECT_EQ(colour("collective", "reduce_scatter bucket 0"), "reduce_scatter");
  EXPECT_EQ(colour("collective", "all_gather bucket 2"), "all_gather");
  EXPECT_EQ(colour("collective", "exchange on tp"), "exchange");
  EXPECT_EQ(colour("collective", "broadcast weights"), "other_collective");
  EXPECT_EQ(colour("send", "send activations to stage 1"), "send_recv");
  EXPECT_EQ(colour("recv", "recv gradients from stage 1"), "send_recv");
}

TraceEvent event(int rank, const std::string& stream, const std::string& category, const std::string& name,
                 double start_ms, double end_ms) {
  TraceEvent made;
  made.rank = rank;
  made.stream = stream;
  made.category = category;
  made.name = name;
  made.start_ms = start_ms;
  made.end_ms = end_ms;
  return made;
}

TEST(TimelinePicture, ExposedCommunicationIsTheCommunicationNoComputeCovers) {
  const std::vector<TraceEvent> events = {
      event(0, "compute", "forward", "forward", 0.0, 3.0),
      event(0, "dp_comm", "collective", "all_reduce bucket 0", 2.0, 6.0),
      event(1, "dp_comm", "collective", "all_reduce bucket 0", 0.0, 1.0),  // another rank's
  };
  const std::vector<graph::Interval> exposed = exposed_communication(events, 0);
  ASSERT_EQ(exposed.size(), 1u);
  EXPECT_DOUBLE_EQ(exposed[0].start_ms, 3.0);
  EXPECT_DOUBLE_EQ(exposed[0].end_ms, 6.0);

  // Several pieces, overlapping communication, compute in the middle of it: the same measure as
  // step_timeline.h's uncovered_length, as sorted disjoint intervals.
  const std::vector<TraceEvent> mixed = {
      event(0, "dp_comm", "collective", "all_reduce bucket 0", 1.0, 5.0),
      event(0, "tp_comm", "collective", "all_gather", 4.0, 8.0),
      event(0, "compute", "backward", "backward", 2.0, 3.0),
      event(0, "compute", "backward", "backward", 3.5, 4.5),
      event(0, "p2p", "send", "send", 9.0, 10.0),
      event(0, "compute", "optimizer", "optimizer", 9.5, 12.0),
  };
  const std::vector<graph::Interval> pieces = exposed_communication(mixed, 0);
  const std::vector<std::pair<double, double>> expected = {{1.0, 2.0}, {3.0, 3.5}, {4.5, 8.0}, {9.0, 9.5}};
  ASSERT_EQ(pieces.size(), expected.size());
  double total = 0.0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_DOUBLE_EQ(pieces[i].start_ms, expected[i].first);
    EXPECT_DOUBLE_EQ(pieces[i].end_ms, expected[i].second);
    total += pieces[i].end_ms - pieces[i].start_ms;
  }
  EXPECT_DOUBLE_EQ(total, graph::uncovered_length({{1.0, 5.0}, {4.0, 8.0}, {9.0, 10.0}},
                                                  {{2.0, 3.0}, {3.5, 4.5}, {9.5, 12.0}}));
  EXPECT_TRUE(exposed_communication(mixed, 1).empty());
}

// A <rect> of the picture: its class, geometry and tooltip.
struct DrawnRect {
  std::string class_name;
  double x = 0, y = 0, width = 0, height = 0;
  std::string title;
};

std::vector<DrawnRect> rects_of_class(const std::string& svg, const std::string& class_prefix) {
  static const std::regex kRect(
      R"re(<rect class="([^"]*)" x="([-0-9.]+)" y="([-0-9.]+)" width="([-0-9.]+)" height="([-0-9.]+)"[^>]*?(/>|><title>([^<]*)</title>))re");
  std::vector<DrawnRect> found;
  for (auto match = std::sregex_iterator(svg.begin(), svg.end(), kRect); match != std::sregex_iterator(); ++match) {
    if ((*match)[1].str().rfind(class_prefix, 0) != 0) continue;
    found.push_back({(*match)[1], std::stod((*match)[2]), std::stod((*match)[3]), std::stod((*match)[4]),
                     std::stod((*match)[5]), (*match)[7]});
  }
  return found;
}

const DrawnRect& rect_titled(const std::vector<DrawnRect>& rects, const std::string& title_start) {
  for (const DrawnRect& rect : rects) {
    if (rect.title.rfind(title_start, 0) == 0) return rect;
  }
  ADD_FAILURE() << "no rect titled '" << title_start << "...'";
  static const DrawnRect kNone;
  return kNone;
}

// Every tag is closed in order (<x/> closes itself; <?xml ...?> is the declaration).
bool tags_balance(const std::string& svg) {
  std::vector<std::string> open;
  for (size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const size_t end = svg.find('>', at);
    if (end == std::string::npos) return false;
    const std::string tag = svg.substr(at + 1, end - at - 1);
    if (tag.empty() || tag[0] == '?') continue;
    const std::string name = tag.substr(tag[0] == '/' ? 1 : 0, tag.find_first_of(" />", 1) - (tag[0] == '/' ? 1 : 0));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
  }
  return open.empty();
}

TEST(TimelinePicture, PictureDrawsEveryEventTheExposedBandsAndOneScale) {
  // Manual: rank 0 computes [0, 3] and communicates [2, 6] (3 ms exposed); rank 1 too, shifted.
  // Auto: half as long, the communication hidden under compute on rank 0.
  TimelinePanel manual;
  manual.title = "manual: step 2, 8.0 ms";
  manual.events = {
      event(0, "compute", "forward", "forward block 0", 0.0, 3.0),
      event(0, "dp_comm", "collective", "all_reduce bucket 0", 2.0, 6.0),
      event(1, "compute", "backward", "backward <block> & co", 0.0, 2.0),
      event(1, "dp_comm", "collective", "reduce_scatter bucket 0", 4.0, 8.0),
  };
  TimelinePanel automatic;
  automatic.title = "auto: step 2, 4.0 ms";
  automatic.events = {
      event(0, "compute", "backward", "backward block 1", 0.0, 4.0),
      event(0, "dp_comm", "collective", "all_gather bucket 0", 1.0, 3.0),
      event(1, "compute", "backward", "backward block 1", 0.0, 3.0),
      event(1, "p2p", "send", "send to stage 1", 2.5, 4.0),
      event(1, "tp_comm", "collective", "exchange on tp", 3.5, 3.9),
  };
  const std::string svg = render_timeline_svg({manual, automatic});

  const std::vector<DrawnRect> events = rects_of_class(svg, "event ");
  ASSERT_EQ(events.size(), manual.events.size() + automatic.events.size());
  const DrawnRect& forward = rect_titled(events, "forward block 0");
  EXPECT_EQ(forward.class_name, "event compute");
  const double px_per_ms = forward.width / 3.0;
  ASSERT_GT(px_per_ms, 10.0);
  // One scale: the auto panel's 4 ms backward is 4/3 of manual's 3 ms forward, and starts at the
  // same x (0 ms).
  const DrawnRect& backward = rect_titled(events, "backward block 1");
  EXPECT_NEAR(backward.width, 4.0 * px_per_ms, 0.02);
  EXPECT_NEAR(backward.x, forward.x, 0.01);
  EXPECT_GT(backward.y, forward.y);  // the second panel is below the first
  const DrawnRect& all_reduce = rect_titled(events, "all_reduce bucket 0");
  EXPECT_EQ(all_reduce.class_name, "event all_reduce");
  EXPECT_NEAR(all_reduce.x - forward.x, 2.0 * px_per_ms, 0.02);
  EXPECT_NEAR(all_reduce.width, 4.0 * px_per_ms, 0.02);
  EXPECT_GT(all_reduce.y, forward.y);  // compute's row first, then dp_comm's
  EXPECT_EQ(rect_titled(events, "send to stage 1").class_name, "event send_recv");
  EXPECT_EQ(rect_titled(events, "exchange on tp").class_name, "event exchange");

  // Exposed bands: manual rank 0 [3, 6] ms; manual rank 1 [4, 8]; auto rank 0 none; auto rank 1
  // [3, 4] (the send and the exchange, once).
  const std::vector<DrawnRect> bands = rects_of_class(svg, "exposed");
  std::vector<DrawnRect> solid;
  for (const DrawnRect& band : bands) {
    if (band.class_name == "exposed") solid.push_back(band);
  }
  ASSERT_EQ(solid.size(), 3u);
  EXPECT_NEAR(solid[0].width, 3.0 * px_per_ms, 0.02);
  EXPECT_NEAR(solid[0].x - forward.x, 3.0 * px_per_ms, 0.02);
  EXPECT_GT(solid[0].y, all_reduce.y);  // under rank 0's rows
  EXPECT_NEAR(solid[1].width, 4.0 * px_per_ms, 0.02);
  EXPECT_NEAR(solid[2].width, 1.0 * px_per_ms, 0.02);
  EXPECT_GT(solid[2].y, backward.y);
  // The totals, in the panels' headers and beside each band.
  expect_contains(svg, {"manual: step 2, 8.0 ms", "auto: step 2, 4.0 ms", "mean 3.50 ms, max 4.00 ms (rank 1)",
                        "mean 0.50 ms, max 1.00 ms (rank 1)", "exposed 3.00 ms", "exposed 0.00 ms"});
  // The legend names what is drawn, and only that.
  expect_contains(svg, {">compute<", ">all_reduce<", ">reduce_scatter<", ">all_gather<", ">exchange<",
                        ">send / recv<", ">exposed communication"});
  EXPECT_EQ(svg.find(">other collective<"), std::string::npos);
  // Tick labels: 0 to 8 ms.
  expect_contains(svg, {">0</text>", ">8 ms</text>"});

  // Escaped, self-contained, balanced.
  EXPECT_NE(svg.find("backward &lt;block&gt; &amp; co"), std::string::npos);
  EXPECT_EQ(svg.find("<block>"), std::string::npos);
  EXPECT_EQ(svg.find("& co"), std::string::npos);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(svg.find("href"), std::string::npos);
  EXPECT_EQ(svg.find("@import"), std::string::npos);
  EXPECT_TRUE(tags_balance(svg));
}

TEST(TimelinePicture, AnEmptyPanelStillDraws) {
  TimelinePanel empty;
  empty.title = "nothing";
  const std::string svg = render_timeline_svg({empty});
  EXPECT_NE(svg.find("no events in this step"), std::string::npos);
  EXPECT_TRUE(rects_of_class(svg, "event ").empty());
  EXPECT_TRUE(tags_balance(svg));
}

TEST_F(TimelinePictureTest, DamagedFilesAreErrorsThatNameThem) {
  expect_contains(error_message([&] { read_chrome_trace(path_); }), {path_, "no such trace file"});

  write(R"({"traceEvents": [{"ph": "X", "name": "forw)");
  expect_contains(error_message([&] { read_chrome_trace(path_); }), {path_, "not valid JSON"});

  write(R"({"events": []})");
  expect_contains(error_message([&] { read_chrome_trace(path_); }), {path_, "no \"traceEvents\" array"});

  write(R"({"traceEvents": [{"name": "forward block 0", "cat": "forward", "pid": 0, "tid": 0, "ph": "X", "dur": 5}]})");
  expect_contains(error_message([&] { read_chrome_trace(path_); }),
                  {path_, "event 0 (\"forward block 0\")", "no numeric \"ts\""});

  write(R"({"traceEvents": [{"ph": "i", "s": "p", "cat": "step", "name": "step 1", "pid": 0, "ts": 5, "args": {}}]})");
  expect_contains(error_message([&] { read_chrome_trace(path_); }), {path_, "no integer \"step\""});

  write(R"({"traceEvents": [3]})");
  expect_contains(error_message([&] { read_chrome_trace(path_); }), {path_, "event 0 is not a JSON object"});
}

TEST(TimelinePicture, WaitsInsideComputeAreExposed) {
  // Compute [0, 10] that blocked on its own collective [2, 6] for [3, 6]: 3 ms exposed.
  const std::vector<TraceEvent> events = {{0, "compute", "forward", "forward block 0", 0.0, 10.0},
                                          {0, "tp_comm", "collective", "all_reduce(sum) on tp", 2.0, 6.0},
                                          {0, "compute", "wait", "waiting for a collective", 3.0, 6.0}};
  EXPECT_EQ(event_colour_class(events[2]), "wait");
  const std::vector<graph::Interval> exposed = exposed_communication(events, 0);
  ASSERT_EQ(exposed.size(), 1u);
  EXPECT_DOUBLE_EQ(exposed[0].start_ms, 3.0);
  EXPECT_DOUBLE_EQ(exposed[0].end_ms, 6.0);
}

}  // namespace
}  // namespace weft
