// Timeline picture (see timeline_picture.h): the trace reader, the step window, and the SVG.
//
// The SVG uses inline attributes only (no <style>, no fonts beyond the generic sans-serif), so that
// browsers, image viewers and converters without CSS support all draw the same picture. Every
// horizontal position is plot_left + ms * px_per_ms with one px_per_ms for the whole picture.
#include "launcher/timeline_picture.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace weft {

namespace {

using nlohmann::json;

// --- reading ---------------------------------------------------------------------------------

// What an error says about the event at `index`: its position, and its name when it has one.
// The string field `key`, or "" when it is absent or not a string (optional fields only).
std::string optional_text(const json& event, const char* key) {
  return event.contains(key) && event[key].is_string() ? event[key].get<std::string>() : std::string();
}

std::string describe_event(const json& event, size_t index) {
  std::string description = str("event ", index);
  if (event.is_object() && event.contains("name") && event["name"].is_string()) {
    description += str(" (\"", event["name"].get<std::string>(), "\")");
  }
  return description;
}

class TraceReader {
 public:
  explicit TraceReader(const std::string& path) : path_(path) {}

  // The field `key` of event `index`, which must be an integer.
  int64_t integer(const json& event, size_t index, const char* key) const {
    WEFT_CHECK(event.contains(key) && event[key].is_number_integer(), "read_chrome_trace: '", path_, "': ",
               describe_event(event, index), " has no integer \"", key, "\"");
    return event[key].get<int64_t>();
  }
  double number(const json& event, size_t index, const char* key) const {
    WEFT_CHECK(event.contains(key) && event[key].is_number(), "read_chrome_trace: '", path_, "': ",
               describe_event(event, index), " has no numeric \"", key, "\"");
    return event[key].get<double>();
  }
  std::string text(const json& event, size_t index, const char* key) const {
    WEFT_CHECK(event.contains(key) && event[key].is_string(), "read_chrome_trace: '", path_, "': ",
               describe_event(event, index), " has no string \"", key, "\"");
    return event[key].get<std::string>();
  }
  const json& arguments(const json& event, size_t index) const {
    WEFT_CHECK(event.contains("args") && event["args"].is_object(), "read_chrome_trace: '", path_, "': ",
               describe_event(event, index), " has no \"args\" object");
    return event["args"];
  }

 private:
  const std::string& path_;
};

json parse_trace_file(const std::string& path) {
  std::error_code error;
  WEFT_CHECK(std::filesystem::is_regular_file(path, error), "read_chrome_trace: no such trace file '", path,
             "' (log.trace_file writes it at the end of a run)");
  std::ifstream file(path);
  WEFT_CHECK(file.is_open(), "read_chrome_trace: cannot open '", path, "' for reading");
  try {
    return json::parse(file);
  } catch (const json::exception& exception) {
    WEFT_FAIL("read_chrome_trace: '", path, "' is not valid JSON (", exception.what(),
              "): the run may have ended before writing it whole");
  }
}

// --- exposed communication ------------------------------------------------------------------

// The union of `intervals` as sorted, disjoint intervals (empty and reversed ones dropped).
std::vector<graph::Interval> merged(std::vector<graph::Interval> intervals) {
  std::erase_if(intervals, [](const graph::Interval& i) { return !(i.end_ms > i.start_ms); });
  std::sort(intervals.begin(), intervals.end(),
            [](const graph::Interval& a, const graph::Interval& b) { return a.start_ms < b.start_ms; });
  std::vector<graph::Interval> result;
  for (const graph::Interval& interval : intervals) {
    if (!result.empty() && interval.start_ms <= result.back().end_ms) {
      result.back().end_ms = std::max(result.back().end_ms, interval.end_ms);
    } else {
      result.push_back(interval);
    }
  }
  return result;
}

// union(intervals) minus union(cover), as sorted disjoint intervals. graph::uncovered_length gives
// only its measure; the picture needs where it is.
std::vector<graph::Interval> uncovered_intervals(std::vector<graph::Interval> intervals,
                                                 std::vector<graph::Interval> cover) {
  const std::vector<graph::Interval> pieces = merged(std::move(intervals));
  const std::vector<graph::Interval> covered = merged(std::move(cover));
  std::vector<graph::Interval> result;
  size_t next_cover = 0;
  for (const graph::Interval& piece : pieces) {
    // Both lists are sorted and disjoint, so a cover that ends before this piece ends before every
    // later piece too.
    while (next_cover < covered.size() && covered[next_cover].end_ms <= piece.start_ms) ++next_cover;
    double cursor = piece.start_ms;
    for (size_t c = next_cover; c < covered.size() && covered[c].start_ms < piece.end_ms; ++c) {
      if (covered[c].start_ms > cursor) result.push_back({cursor, covered[c].start_ms});
      cursor = std::max(cursor, covered[c].end_ms);
    }
    if (cursor < piece.end_ms) result.push_back({cursor, piece.end_ms});
  }
  return result;
}

double total_length(const std::vector<graph::Interval>& intervals) {
  double total = 0.0;
  for (const graph::Interval& interval : intervals) total += interval.end_ms - interval.start_ms;
  return total;
}

// --- drawing ---------------------------------------------------------------------------------

// Layout, in px. The plot is kPlotWidth wide whatever the steps' lengths: the longest panel sets
// the scale and the others are drawn shorter.
constexpr double kMargin = 16;
constexpr double kLabelWidth = 150;   // row labels, left of the plot
constexpr double kPlotWidth = 1000;
constexpr double kRightMargin = 48;   // room for the last tick's label
constexpr double kLegendHeight = 30;
constexpr double kTitleHeight = 20;
constexpr double kSubtitleHeight = 18;
constexpr double kRowHeight = 16;
constexpr double kRowGap = 3;
constexpr double kBandHeight = 7;
constexpr double kRankGap = 10;
constexpr double kAxisHeight = 26;
constexpr double kPanelGap = 22;
constexpr double kMinimumEventWidth = 0.5;  // so that a microsecond-long event is still seen
constexpr const char* kExposedColour = "#d62728";

struct ColourClass {
  const char* name;    // event_colour_class's value
  const char* label;   // the legend's
  const char* colour;
};
// Tableau 10: distinct at a glance and readable for the common colour blindnesses; compute is the
// calm blue, so that the communication stands out against it.
constexpr ColourClass kColourClasses[] = {
    {"compute", "compute", "#4e79a7"},         {"all_reduce", "all_reduce", "#f28e2b"},
    {"reduce_scatter", "reduce_scatter", "#59a14f"}, {"all_gather", "all_gather", "#76b7b2"},
    {"exchange", "exchange", "#edc948"},       {"send_recv", "send / recv", "#b07aa1"},
    {"other_collective", "other collective", "#9c755f"},
    {"wait", "compute waiting for a collective", "#d9d9d9"},
};

const char* colour_of(const std::string& colour_class) {
  for (const ColourClass& known : kColourClasses) {
    if (colour_class == known.name) return known.colour;
  }
  return "#9c755f";
}

// Streams in the order of the executor's StreamClass; others after them, by name.
int stream_order(const std::string& stream) {
  static const char* const kKnown[] = {"compute", "tp_comm", "dp_comm", "p2p"};
  for (int i = 0; i < 4; ++i) {
    if (stream == kKnown[i]) return i;
  }
  return 4;
}

bool stream_before(const std::string& a, const std::string& b) {
  const int order_a = stream_order(a);
  const int order_b = stream_order(b);
  return order_a != order_b ? order_a < order_b : a < b;
}

// Text for XML content and attributes. Control characters other than tab and newline are not
// allowed in XML 1.0 at all, so they become spaces.
std::string xml_escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? ' ' : c;
    }
  }
  return out;
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string px(double value) { return fixed(value, 2); }

// The time axis shared by every panel: ticks at 1, 2 or 5 times a power of ten, about eight of them.
struct TimeAxis {
  double max_ms = 1.0;
  double tick_ms = 0.1;
  double px_per_ms = kPlotWidth;
  int decimals = 0;  // of the tick labels

  explicit TimeAxis(double longest_ms) {
    if (!(longest_ms > 0.0) || !std::isfinite(longest_ms)) longest_ms = 1.0;
    const double rough = longest_ms / 8.0;
    const double power = std::pow(10.0, std::floor(std::log10(rough)));
    tick_ms = 10.0 * power;
    for (double multiple : {1.0, 2.0, 5.0}) {
      if (multiple * power >= rough) {
        tick_ms = multiple * power;
        break;
      }
    }
    max_ms = std::ceil(longest_ms / tick_ms - 1e-9) * tick_ms;
    px_per_ms = kPlotWidth / max_ms;
    decimals = tick_ms >= 1.0 ? 0 : static_cast<int>(std::ceil(-std::log10(tick_ms) - 1e-9));
  }
  int tick_count() const { return static_cast<int>(std::lround(max_ms / tick_ms)); }
};

// One (rank, stream) row of a panel and the events drawn on it.
struct Row {
  int rank = 0;
  std::string stream;
  std::vector<const TraceEvent*> events;
};

// A panel's rows, grouped by rank, in drawing order.
std::map<int, std::vector<Row>> rows_by_rank(const std::vector<TraceEvent>& events) {
  std::map<int, std::map<std::string, Row, decltype(&stream_before)>> grouped;
  for (const TraceEvent& event : events) {
    auto [rank_rows, unused] = grouped.try_emplace(event.rank, &stream_before);
    Row& row = rank_rows->second[event.stream];
    row.rank = event.rank;
    row.stream = event.stream;
    row.events.push_back(&event);
  }
  std::map<int, std::vector<Row>> result;
  for (auto& [rank, streams] : grouped) {
    for (auto& [stream, row] : streams) result[rank].push_back(std::move(row));
  }
  return result;
}

class SvgPicture {
 public:
  explicit SvgPicture(const TimeAxis& axis) : axis_(axis) {}

  double x_of(double ms) const { return plot_left() + ms * axis_.px_per_ms; }
  static double plot_left() { return kMargin + kLabelWidth; }

  void text(std::ostringstream& out, double x, double y, const std::string& content, const std::string& extra = "") {
    out << "<text x=\"" << px(x) << "\" y=\"" << px(y) << "\"" << (extra.empty() ? "" : " ") << extra << ">"
        << xml_escaped(content) << "</text>\n";
  }

  // The legend: a swatch per colour class drawn anywhere, then the exposed band's.
  double legend(std::ostringstream& out, const std::set<std::string>& drawn_classes, double top) {
    double x = kMargin;
    auto item = [&](const std::string& label, const char* colour, const char* class_name) {
      out << "<rect class=\"" << class_name << "\" x=\"" << px(x) << "\" y=\"" << px(top) << "\" width=\"12\" "
          << "height=\"12\" fill=\"" << colour << "\"/>\n";
      text(out, x + 16, top + 10, label);
      x += 16 + 6.5 * static_cast<double>(label.size()) + 18;  // a sans-serif 11 px character is ~6 px
    };
    for (const ColourClass& known : kColourClasses) {
      if (drawn_classes.count(known.name)) item(known.label, known.colour, "legend");
    }
    item("exposed communication (communicating, not computing)", kExposedColour, "legend");
    return top + kLegendHeight;
  }

  // One panel from `top`; returns where the next one begins. Grid, shading and bands go to `back`
  // so that the events, drawn later, stay on top.
  double panel(std::ostringstream& back, std::ostringstream& front, const TimelinePanel& panel, double top) {
    text(front, kMargin, top + 14, panel.title, "font-size=\"13\" font-weight=\"bold\"");
    const std::map<int, std::vector<Row>> ranks = rows_by_rank(panel.events);

    std::map<int, std::vector<graph::Interval>> exposed;
    double exposed_sum = 0.0;
    double exposed_max = 0.0;
    int exposed_max_rank = 0;
    for (const auto& [rank, rows] : ranks) {
      exposed[rank] = exposed_communication(panel.events, rank);
      const double length = total_length(exposed[rank]);
      exposed_sum += length;
      if (exposed.size() == 1 || length > exposed_max) {
        exposed_max = length;
        exposed_max_rank = rank;
      }
    }
    std::string subtitle;
    if (ranks.empty()) {
      subtitle = "no events in this step";
    } else if (ranks.size() == 1) {
      subtitle = str("exposed communication (red): ", fixed(exposed_sum, 2), " ms");
    } else {
      subtitle = str("exposed communication (red), per rank: mean ", fixed(exposed_sum / ranks.size(), 2),
                     " ms, max ", fixed(exposed_max, 2), " ms (rank ", exposed_max_rank, ")");
    }
    text(front, kMargin, top + kTitleHeight + 12, subtitle, "fill=\"#444\"");

    const double rows_top = top + kTitleHeight + kSubtitleHeight;
    double y = rows_top;
    for (const auto& [rank, rows] : ranks) {
      const double rank_top = y;
      for (const Row& row : rows) {
        text(front, kMargin, y + 12, str("rank ", rank, " ", row.stream));
        back << "<rect x=\"" << px(plot_left()) << "\" y=\"" << px(y) << "\" width=\"" << px(kPlotWidth)
             << "\" height=\"" << px(kRowHeight) << "\" fill=\"#f4f4f4\"/>\n";
        for (const TraceEvent* event : row.events) draw_event(front, *event, y);
        y += kRowHeight + kRowGap;
      }
      // The band: where this rank waited on communication. A faint shade over the rank's rows
      // shows what the other streams were doing meanwhile.
      const std::vector<graph::Interval>& intervals = exposed[rank];
      for (const graph::Interval& interval : intervals) {
        const double x = x_of(interval.start_ms);
        const double width = (interval.end_ms - interval.start_ms) * axis_.px_per_ms;
        back << "<rect class=\"exposed-shade\" x=\"" << px(x) << "\" y=\"" << px(rank_top) << "\" width=\""
             << px(width) << "\" height=\"" << px(y - rank_top) << "\" fill=\"" << kExposedColour
             << "\" fill-opacity=\"0.12\"/>\n";
        front << "<rect class=\"exposed\" x=\"" << px(x) << "\" y=\"" << px(y) << "\" width=\"" << px(width)
              << "\" height=\"" << px(kBandHeight) << "\" fill=\"" << kExposedColour << "\"><title>"
              << xml_escaped(str("rank ", rank, ": exposed communication from ", fixed(interval.start_ms, 3),
                                 " to ", fixed(interval.end_ms, 3), " ms (",
                                 fixed(interval.end_ms - interval.start_ms, 3), " ms)"))
              << "</title></rect>\n";
      }
      text(front, kMargin, y + kBandHeight,
           str("exposed ", fixed(total_length(intervals), 2), " ms"),
           str("font-size=\"9\" fill=\"", kExposedColour, "\""));
      y += kBandHeight + kRankGap;
    }
    const double rows_bottom = std::max(y - kRankGap, rows_top + kRowHeight);
    axis(back, front, rows_top, rows_bottom);
    return rows_bottom + kAxisHeight + kPanelGap;
  }

 private:
  void draw_event(std::ostringstream& out, const TraceEvent& event, double row_top) {
    const std::string colour_class = event_colour_class(event);
    const double duration = std::max(0.0, event.end_ms - event.start_ms);
    out << "<rect class=\"event " << colour_class << "\" x=\"" << px(x_of(event.start_ms)) << "\" y=\""
        << px(row_top) << "\" width=\"" << px(std::max(kMinimumEventWidth, duration * axis_.px_per_ms))
        << "\" height=\"" << px(kRowHeight) << "\" fill=\"" << colour_of(colour_class)
        << "\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>"
        << xml_escaped(str(event.name, "\n", event.category, ", rank ", event.rank, " ", event.stream, ": ",
                           fixed(event.start_ms, 3), " to ", fixed(event.end_ms, 3), " ms (", fixed(duration, 3),
                           " ms)"))
        << "</title></rect>\n";
  }

  // Grid lines through the rows, and under them the axis with its tick labels.
  void axis(std::ostringstream& back, std::ostringstream& front, double rows_top, double rows_bottom) {
    const double axis_y = rows_bottom + 4;
    front << "<line x1=\"" << px(plot_left()) << "\" y1=\"" << px(axis_y) << "\" x2=\"" << px(x_of(axis_.max_ms))
          << "\" y2=\"" << px(axis_y) << "\" stroke=\"#333\" stroke-width=\"1\"/>\n";
    for (int tick = 0; tick <= axis_.tick_count(); ++tick) {
      const double ms = tick * axis_.tick_ms;
      const double x = x_of(ms);
      back << "<line x1=\"" << px(x) << "\" y1=\"" << px(rows_top) << "\" x2=\"" << px(x) << "\" y2=\""
           << px(rows_bottom) << "\" stroke=\"#dddddd\" stroke-width=\"1\"/>\n";
      front << "<line x1=\"" << px(x) << "\" y1=\"" << px(axis_y) << "\" x2=\"" << px(x) << "\" y2=\""
            << px(axis_y + 4) << "\" stroke=\"#333\" stroke-width=\"1\"/>\n";
      const std::string label = fixed(ms, axis_.decimals) + (tick == axis_.tick_count() ? " ms" : "");
      text(front, x, axis_y + 16, label, "text-anchor=\"middle\" fill=\"#333\"");
    }
  }

  const TimeAxis& axis_;
};

}  // namespace

Trace read_chrome_trace(const std::string& path) {
  const json document = parse_trace_file(path);
  // log.trace_file writes {"traceEvents": [...]}; the format also allows the bare array.
  const json* events = nullptr;
  if (document.is_array()) {
    events = &document;
  } else if (document.is_object() && document.contains("traceEvents") && document["traceEvents"].is_array()) {
    events = &document["traceEvents"];
  }
  WEFT_CHECK(events != nullptr, "read_chrome_trace: '", path,
             "' has no \"traceEvents\" array: it is not a Chrome trace written by log.trace_file");
  const TraceReader reader(path);

  // Thread names first: each rank's metadata comes before its events, but nothing requires it.
  std::map<std::pair<int64_t, int64_t>, std::string> stream_names;
  for (size_t index = 0; index < events->size(); ++index) {
    const json& event = (*events)[index];
    WEFT_CHECK(event.is_object(), "read_chrome_trace: '", path, "': event ", index, " is not a JSON object");
    if (reader.text(event, index, "ph") != "M" || optional_text(event, "name") != "thread_name") continue;
    const std::pair<int64_t, int64_t> thread{reader.integer(event, index, "pid"), reader.integer(event, index, "tid")};
    stream_names[thread] = reader.text(reader.arguments(event, index), index, "name");
  }

  Trace trace;
  for (size_t index = 0; index < events->size(); ++index) {
    const json& event = (*events)[index];
    const std::string phase = reader.text(event, index, "ph");
    if (phase == "X") {
      TraceEvent read;
      const int64_t pid = reader.integer(event, index, "pid");
      const int64_t tid = reader.integer(event, index, "tid");
      read.rank = static_cast<int>(pid);
      const auto named = stream_names.find({pid, tid});
      read.stream = named != stream_names.end() ? named->second : str("stream ", tid);
      read.name = reader.text(event, index, "name");
      read.category = optional_text(event, "cat");
      if (read.category.empty()) read.category = "other";  // the format makes cat optional
      const double ts = reader.number(event, index, "ts");
      const double dur = reader.number(event, index, "dur");
      WEFT_CHECK(dur >= 0.0, "read_chrome_trace: '", path, "': ", describe_event(event, index),
                 " has a negative \"dur\" (", dur, ")");
      read.start_ms = ts / 1000.0;
      read.end_ms = (ts + dur) / 1000.0;
      trace.events.push_back(std::move(read));
    } else if (phase == "i" && optional_text(event, "s") == "p" && optional_text(event, "cat") == "step") {
      TraceStep marker;
      marker.rank = static_cast<int>(reader.integer(event, index, "pid"));
      marker.step = reader.integer(reader.arguments(event, index), index, "step");
      marker.start_ms = reader.number(event, index, "ts") / 1000.0;
      trace.steps.push_back(marker);
    }
    // Everything else (signals, counters, other metadata) is not part of the picture.
  }
  std::stable_sort(trace.steps.begin(), trace.steps.end(), [](const TraceStep& a, const TraceStep& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.start_ms < b.start_ms;
  });
  return trace;
}

std::vector<TraceEvent> events_of_step(const Trace& trace, int64_t step) {
  struct Window {
    double begin_ms = 0.0;
    double end_ms = 0.0;
  };
  std::map<int, Window> windows;
  double origin_ms = std::numeric_limits<double>::infinity();
  // trace.steps is sorted by rank, then time: a rank's next marker is the next entry of its rank.
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const TraceStep& marker = trace.steps[i];
    if (marker.step != step || windows.count(marker.rank)) continue;
    const bool has_next = i + 1 < trace.steps.size() && trace.steps[i + 1].rank == marker.rank;
    windows[marker.rank] = {marker.start_ms,
                            has_next ? trace.steps[i + 1].start_ms : std::numeric_limits<double>::infinity()};
    origin_ms = std::min(origin_ms, marker.start_ms);
  }
  std::vector<TraceEvent> result;
  for (const TraceEvent& event : trace.events) {
    const auto window = windows.find(event.rank);
    if (window == windows.end()) continue;
    if (event.start_ms < window->second.begin_ms || event.start_ms >= window->second.end_ms) continue;
    TraceEvent moved = event;
    moved.start_ms -= origin_ms;
    moved.end_ms -= origin_ms;
    result.push_back(std::move(moved));
  }
  return result;
}

std::string event_colour_class(const TraceEvent& event) {
  if (event.category == "send" || event.category == "recv") return "send_recv";
  if (event.category == "wait") return "wait";
  if (event.category != "collective") return "compute";
  // The operation is the name's first word: "all_reduce bucket 3", "all_reduce(sum) on tp".
  size_t length = 0;
  while (length < event.name.size() &&
         (std::islower(static_cast<unsigned char>(event.name[length])) || event.name[length] == '_')) {
    ++length;
  }
  const std::string operation = event.name.substr(0, length);
  for (const char* known : {"all_reduce", "reduce_scatter", "all_gather", "exchange"}) {
    if (operation == known) return operation;
  }
  return "other_collective";
}

std::vector<graph::Interval> exposed_communication(const std::vector<TraceEvent>& events, int rank) {
  std::vector<graph::Interval> communication;
  std::vector<graph::Interval> compute;
  std::vector<graph::Interval> waits;  // inside compute events: the thread blocked on a collective
  for (const TraceEvent& event : events) {
    if (event.rank != rank) continue;
    const std::string colour_class = event_colour_class(event);
    (colour_class == "compute" ? compute : colour_class == "wait" ? waits : communication)
        .push_back({event.start_ms, event.end_ms});
  }
  return uncovered_intervals(std::move(communication), graph::subtract_intervals(std::move(compute), std::move(waits)));
}

std::string render_timeline_svg(const std::vector<TimelinePanel>& panels) {
  double longest_ms = 0.0;
  std::set<std::string> drawn_classes;
  for (const TimelinePanel& panel : panels) {
    for (const TraceEvent& event : panel.events) {
      longest_ms = std::max(longest_ms, event.end_ms);
      drawn_classes.insert(event_colour_class(event));
    }
  }
  const TimeAxis axis(longest_ms);
  SvgPicture picture(axis);

  std::ostringstream back;
  std::ostringstream front;
  double y = picture.legend(front, drawn_classes, kMargin);
  for (const TimelinePanel& panel : panels) y = picture.panel(back, front, panel, y);
  const double width = kMargin + kLabelWidth + kPlotWidth + kRightMargin;
  const double height = y - kPanelGap + kMargin;

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << px(width) << "\" height=\"" << px(height)
      << "\" viewBox=\"0 0 " << px(width) << " " << px(height)
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << px(width) << "\" height=\"" << px(height) << "\" fill=\"#ffffff\"/>\n"
      << back.str() << front.str() << "</svg>\n";
  return svg.str();
}

}  // namespace weft
