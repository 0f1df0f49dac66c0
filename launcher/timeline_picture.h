// Timeline picture: one step of a run, read back from its Chrome trace (log.trace_file), drawn as
// an SVG that a person opens first — several runs of the same step stacked (weft-compare's "manual"
// above "auto"), on one time scale, so the longer step is visibly longer.
//
// The trace is the one parallel/data/data_parallel_strategy.cc writes: per rank (pid) and stream
// (tid, named by "thread_name" metadata) a complete event ("X") per node, and per rank and step an
// instant marker ({"ph":"i","s":"p","cat":"step","args":{"step":N}}) where the step began. Signals,
// counters and other metadata are skipped. Times are kept in milliseconds.
//
// Exposed communication is step_timeline.h's notion, per rank: the union of the rank's
// communication intervals (collectives, sends, receives) minus the union of its compute intervals.
// The picture draws those intervals themselves, as a red band under each rank's rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/graph/step_timeline.h"

namespace weft {

struct TraceEvent {
  int rank = 0;           // the event's pid
  std::string stream;     // its thread's name: compute, tp_comm, dp_comm, p2p (else "stream <tid>")
  std::string category;   // its cat: forward, backward, collective, send, recv, optimizer, other
  std::string name;
  double start_ms = 0.0;  // ts / 1000
  double end_ms = 0.0;    // (ts + dur) / 1000
};

struct TraceStep {
  int rank = 0;
  int64_t step = 0;
  double start_ms = 0.0;  // the marker's ts / 1000
};

struct Trace {
  std::vector<TraceEvent> events;  // in the file's order
  std::vector<TraceStep> steps;    // sorted by rank, then time
};

// Reads a trace file written by log.trace_file. A missing, unparsable or malformed file (an event
// without a numeric ts, say) is a weft::Error naming the path and what is wrong.
Trace read_chrome_trace(const std::string& path);

// The events of step `step` on every rank: those that start between the rank's marker of that
// step and its next marker (or the end of the trace), in the trace's order, with times relative to
// the earliest of the ranks' markers of `step` (0 = the step's start on the first rank to start
// it). Ranks without a marker of `step` contribute nothing; empty when no rank has one.
std::vector<TraceEvent> events_of_step(const Trace& trace, int64_t step);

// An event's colour class: "compute" for forward, backward, optimizer and other work; for
// communication, the collective from the name's first word: "all_reduce", "reduce_scatter",
// "all_gather", "exchange", else "other_collective"; "send_recv" for categories send and recv;
// "wait" for category wait (the compute thread blocked, inside a node, on a collective it issued).
std::string event_colour_class(const TraceEvent& event);

// The intervals in which `rank` communicated and did not compute (its exposed communication),
// sorted and disjoint: the union of its communication events minus the union of its compute events
// less its waits.
std::vector<graph::Interval> exposed_communication(const std::vector<TraceEvent>& events, int rank);

struct TimelinePanel {
  std::string title;               // e.g. "manual: step 6, 41.2 ms, exposed communication 12.0 ms"
  std::vector<TraceEvent> events;  // one step, times from 0 (events_of_step)
};

// The panels stacked vertically in one self-contained SVG (inline colours, generic font, names
// escaped, each event's name and times as a <title> tooltip). Each panel has a row per (rank,
// stream) with events — ranks in order, then compute, tp_comm, dp_comm, p2p, then other streams by
// name — and under each rank's rows a red band of its exposed communication, labelled with the
// rank's total in ms; the panel's header gives the total (mean and max over ranks). Every panel
// shares one time axis in ms (ticks and grid lines), so equal durations are equal widths
// everywhere. A legend names the colour classes drawn.
// Event rectangles carry class="event <colour class>", exposed bands class="exposed".
std::string render_timeline_svg(const std::vector<TimelinePanel>& panels);

}  // namespace weft
