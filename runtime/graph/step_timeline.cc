// StepTimeline (see step_timeline.h): interval arithmetic for the step metrics, Chrome trace output.
//
// |A \ C| = |A ∪ C| - |C| for unions of intervals, so exposed communication needs no interval
// subtraction: two sorted sweeps.
#include "runtime/graph/step_timeline.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace weft::graph {

double union_length(std::vector<Interval> intervals) {
  std::erase_if(intervals, [](const Interval& i) { return !(i.end_ms > i.start_ms); });
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.start_ms < b.start_ms; });
  double total = 0.0;
  bool open = false;
  double start = 0.0;
  double end = 0.0;
  for (const Interval& interval : intervals) {
    if (open && interval.start_ms <= end) {
      end = std::max(end, interval.end_ms);
      continue;
    }
    if (open) total += end - start;
    start = interval.start_ms;
    end = interval.end_ms;
    open = true;
  }
  if (open) total += end - start;
  return total;
}

double uncovered_length(const std::vector<Interval>& intervals, const std::vector<Interval>& cover) {
  std::vector<Interval> both = intervals;
  both.insert(both.end(), cover.begin(), cover.end());
  return std::max(0.0, union_length(std::move(both)) - union_length(cover));
}

std::vector<Interval> subtract_intervals(std::vector<Interval> intervals, std::vector<Interval> removed) {
  auto normalize = [](std::vector<Interval>& list) {
    std::erase_if(list, [](const Interval& i) { return !(i.end_ms > i.start_ms); });
    std::sort(list.begin(), list.end(), [](const Interval& a, const Interval& b) { return a.start_ms < b.start_ms; });
    std::vector<Interval> merged;
    for (const Interval& interval : list) {
      if (!merged.empty() && interval.start_ms <= merged.back().end_ms) {
        merged.back().end_ms = std::max(merged.back().end_ms, interval.end_ms);
      } else {
        merged.push_back(interval);
      }
    }
    list = std::move(merged);
  };
  normalize(intervals);
  normalize(removed);
  std::vector<Interval> out;
  size_t r = 0;
  for (Interval piece : intervals) {
    while (r < removed.size() && removed[r].end_ms <= piece.start_ms) ++r;
    for (size_t k = r; k < removed.size() && removed[k].start_ms < piece.end_ms; ++k) {
      if (removed[k].start_ms > piece.start_ms) out.push_back({piece.start_ms, removed[k].start_ms});
      piece.start_ms = std::max(piece.start_ms, removed[k].end_ms);
    }
    if (piece.end_ms > piece.start_ms) out.push_back(piece);
  }
  return out;
}

void StepTimeline::compute_metrics() {
  std::vector<Interval> compute;
  std::vector<Interval> comm;
  for (const NodeTiming& timing : nodes) {
    if (timing.signal) continue;
    (is_communication(timing.kind) ? comm : compute).push_back({timing.start_ms, timing.end_ms});
  }
  if (!compute_waits.empty()) compute = subtract_intervals(std::move(compute), compute_waits);
  compute_ms = union_length(compute);
  comm_ms = union_length(comm);
  exposed_comm_ms = uncovered_length(comm, compute);
  overlap_ratio = comm_ms > 0.0 ? std::clamp(1.0 - exposed_comm_ms / comm_ms, 0.0, 1.0) : 0.0;
}

namespace {

std::string format_us(double milliseconds) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.3f", milliseconds * 1000.0);
  return text;
}

}  // namespace

std::string StepTimeline::chrome_trace_events(int process_id, const std::string& process_name,
                                              double offset_ms) const {
  std::ostringstream out;
  const std::string pid = std::to_string(process_id);
  out << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << pid << ", \"tid\": 0, \"args\": {\"name\": "
      << json_quote(process_name.empty() ? "rank " + pid : process_name) << "}}";
  for (StreamClass stream : kAllStreamClasses) {
    const int tid = static_cast<int>(stream);
    out << ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " << pid << ", \"tid\": " << tid
        << ", \"args\": {\"name\": " << json_quote(stream_class_name(stream)) << "}}"
        << ",\n{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": " << pid << ", \"tid\": " << tid
        << ", \"args\": {\"sort_index\": " << tid << "}}";
  }
  for (const NodeTiming& timing : nodes) {
    out << ",\n{\"name\": " << json_quote(timing.name) << ", \"cat\": " << json_quote(node_kind_name(timing.kind))
        << ", \"pid\": " << pid << ", \"tid\": " << static_cast<int>(timing.stream)
        << ", \"ts\": " << format_us(timing.start_ms + offset_ms);
    if (timing.signal) {
      out << ", \"ph\": \"i\", \"s\": \"t\"";
    } else {
      out << ", \"ph\": \"X\", \"dur\": " << format_us(std::max(0.0, timing.duration_ms()));
    }
    out << ", \"args\": {\"node\": " << timing.node << ", \"micro_batch\": " << timing.micro_batch
        << ", \"bytes\": " << timing.bytes << "}}";
  }
  // The compute thread's waits for collectives inside its nodes, on the compute row.
  for (const Interval& wait : compute_waits) {
    out << ",\n{\"name\": \"waiting for a collective\", \"cat\": \"wait\", \"pid\": " << pid
        << ", \"tid\": " << static_cast<int>(StreamClass::kCompute) << ", \"ts\": " << format_us(wait.start_ms + offset_ms)
        << ", \"ph\": \"X\", \"dur\": " << format_us(std::max(0.0, wait.end_ms - wait.start_ms)) << "}";
  }
  return out.str();
}

std::string StepTimeline::to_chrome_trace_json(int process_id, const std::string& process_name,
                                               double offset_ms) const {
  std::ostringstream out;
  out << "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"step_ms\": " << step_ms << ", \"compute_ms\": "
      << compute_ms << ", \"comm_ms\": " << comm_ms << ", \"exposed_comm_ms\": " << exposed_comm_ms
      << ", \"overlap_ratio\": " << overlap_ratio << "},\n\"traceEvents\": [\n"
      << chrome_trace_events(process_id, process_name, offset_ms) << "\n]}\n";
  return out.str();
}

}  // namespace weft::graph
