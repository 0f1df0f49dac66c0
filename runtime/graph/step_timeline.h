// StepTimeline: when each node of one executed step ran, and where the step's time went.
//
// Times are milliseconds since the step began (the executor's start: the first instruction on CPU,
// the step's start event on CUDA). Metrics, from the nodes' intervals:
// - compute_ms: measure of the union of compute intervals (every node that is not a collective,
//   send or recv), less the compute_waits inside them;
// - comm_ms: measure of the union of communication intervals (collectives, sends, recvs), on
//   whichever stream they ran;
// - exposed_comm_ms: measure of the communication intervals not covered by any compute interval
//   (time in which the step communicated and did not compute);
// - overlap_ratio: 1 - exposed_comm_ms / comm_ms, in [0, 1]; 0 when the step did not communicate;
// - step_ms: from the step's start to its last node's end (or the executor's join).
// Signal nodes (zero length) are kept in `nodes` and count nowhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/graph/step_graph.h"

namespace weft::graph {

struct Interval {
  double start_ms = 0.0;
  double end_ms = 0.0;
};

// Measure of the union of `intervals` (empty or reversed intervals count 0).
double union_length(std::vector<Interval> intervals);
// Measure of the part of union(`intervals`) that union(`cover`) does not cover.
double uncovered_length(const std::vector<Interval>& intervals, const std::vector<Interval>& cover);
// union(`intervals`) minus union(`removed`), as sorted disjoint intervals.
std::vector<Interval> subtract_intervals(std::vector<Interval> intervals, std::vector<Interval> removed);

struct NodeTiming {
  NodeId node = -1;
  std::string name;
  NodeKind kind = NodeKind::kOther;
  StreamClass stream = StreamClass::kCompute;  // the stream it ran on (the plan's, not the node's)
  int micro_batch = -1;
  int64_t bytes = 0;
  bool signal = false;
  double start_ms = 0.0;
  double end_ms = 0.0;
  double duration_ms() const { return end_ms - start_ms; }
};

struct StepTimeline {
  std::vector<NodeTiming> nodes;  // indexed by NodeId, then collectives recorded inside nodes (node -1)
  double step_ms = 0.0;
  double compute_ms = 0.0;
  double comm_ms = 0.0;
  double exposed_comm_ms = 0.0;
  double overlap_ratio = 0.0;
  // Where the compute thread waited, inside a node, for a collective that node issued (the
  // tensor-parallel layers' collectives: parallel/comm/traced_process_group.h), ms since the
  // step's start: compute_metrics counts them as not computing. Those collectives are in `nodes`
  // with node -1. Empty where nothing recorded them (CUDA, where waits do not block the host).
  std::vector<Interval> compute_waits;
  // clock_ms() at the step's start on the CPU (the executor's origin); -1 on CUDA, whose times
  // come from events.
  double origin_clock_ms = -1.0;
  // clock_ms() at which the step began, to lay steps out on one time axis (traces): origin_clock_ms
  // on the CPU; on CUDA the later of the host's issue of the step and the end of the step before on
  // the device (a step issued while another runs starts when that one ends).
  double start_clock_ms = 0.0;
  // clock_ms() by which the step had ended: on the CPU when its last node completed; on CUDA
  // start_clock_ms plus the step's span on the device (at most when Executor::finish() saw its end:
  // the host may come there late, busy issuing the next step).
  double end_clock_ms = 0.0;

  // Sets compute_ms, comm_ms, exposed_comm_ms and overlap_ratio from `nodes` (step_ms is left as is).
  void compute_metrics();
  // The Chrome trace event format (chrome://tracing, ui.perfetto.dev): one thread per stream of
  // process `process_id` (an MPI rank, say), a complete event ("X") per node, an instant event per
  // signal; times in microseconds from the step's start plus `offset_ms` (to lay steps end to end).
  std::string to_chrome_trace_json(int process_id = 0, const std::string& process_name = "",
                                   double offset_ms = 0.0) const;
  // The events alone, comma-separated without brackets, to merge several steps or ranks into one
  // trace: "{\"traceEvents\": [" + a + "," + b + "]}".
  std::string chrome_trace_events(int process_id = 0, const std::string& process_name = "",
                                  double offset_ms = 0.0) const;
};

}  // namespace weft::graph
