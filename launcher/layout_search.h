// Layout search: every way to spread a workload over N ranks that weft can run — dp x tp x pp,
// ZeRO stage, micro-batch count, pipeline schedule, sequence parallelism — each predicted by the
// step simulator (parallel/cost/step_simulator.h), those that do not fit in memory dropped, the
// rest ranked by predicted step time. What weft-plan prints.
//
// Enumerated: dp * tp * pp == ranks with tp dividing the heads, kv heads, vocabulary and MLP width;
// ZeRO 0, 1, 2 when dp > 1; micro-batches among the divisors of the per-dp-rank batch (at least pp
// with a pipeline); for pp > 1 the schedules 1f1b, gpipe, zero_bubble and interleaved with 2
// chunks; sp off and on when tp > 1. Layouts that layout_problem refuses are not listed. Every
// layout is predicted in the config's comm mode, its pipeline messages over the route it would run
// with: NCCL's send/recv (parallel.pp_transport direct) on GPUs in the auto mode, else the host
// route (the default, and the manual mode's only route).
#pragma once

#include <string>
#include <vector>

#include "parallel/cost/cost_model.h"
#include "parallel/cost/step_simulator.h"

namespace weft {

struct LayoutSearchOptions {
  int ranks = 1;
  int ranks_per_host = 8;
  double memory_limit_bytes = 0.0;  // 0: no limit
  std::string comm_mode = "auto";
  std::string dp_all_reduce = "auto";  // comm.dp_all_reduce, for every layout
  int max_micro_batches = 64;       // larger counts are not tried
  bool on_gpus = false;             // the ranks are GPUs (the pipeline route, above)
};

struct LayoutCandidate {
  ParallelLayout layout;
  StepPrediction prediction;
  bool fits = true;                 // within the memory limit
};

struct LayoutSearch {
  std::vector<LayoutCandidate> candidates;  // fitting ones first, each group by predicted step time
  int considered = 0;
  int too_large = 0;                        // dropped for memory
  // Not offered: comm.dp_all_reduce hierarchical does not fit them (the run would refuse them).
  int refused_hierarchical = 0;
};

LayoutSearch search_layouts(const Workload& workload, const CostModel& model, const LayoutSearchOptions& options);

// The best `rows` fitting candidates, fastest first: the rows weft-plan shows.
std::vector<const LayoutCandidate*> shown_layouts(const LayoutSearch& search, int rows);
// The table weft-plan prints: shown_layouts, one line each.
std::string layout_table(const LayoutSearch& search, int rows);
// The weft-train settings ("section.key=value", each for a --set) that run `layout` as predicted:
// parallel.dp, tp, pp and zero, train.micro_batches and comm.mode always; with pp > 1 the schedule
// and its chunks, and parallel.pp_transport=direct where the layout takes that route (the send/recv
// the prediction assumed); with tp > 1 parallel.sp.
std::vector<std::string> layout_settings(const ParallelLayout& layout);

}  // namespace weft
