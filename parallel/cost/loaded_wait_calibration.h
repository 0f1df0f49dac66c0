// Loaded-wait calibration: how much longer a collective takes on an oversubscribed CPU host (more
// ranks than cores) when the ranks reach it from compute, as every collective of a training step
// does, than when they wait idle in it, as the link calibration measures it (calibration.h).
//
// Why: four ranks on two cores measured about 1.1 ms more per tensor-parallel all-reduce of four
// ranks, and 0.5 ms more per all-reduce of two, than the idle fit (docs/performance.md, "Four CPU
// ranks"): each rank got another share of the cores, so they arrive apart, and a peer that is
// descheduled must run again before the others proceed. The step simulator pays this wait per
// collective and receive on the critical path (step_simulator.h), so that the layouts with many
// small collectives (tensor parallelism) are not predicted as cheap as the others.
//
// How: every rank of the world alternates a compute burst (a square matmul sized to take 0.1 ms
// on one rank alone, about a step's compute between two tensor-parallel collectives) with an
// all-reduce of 8 bytes (a loss's size: its own cost is the fit's latency), in groups of
// consecutive ranks as a step's tensor-parallel groups are laid out (2, 4, ... and the whole
// world), all groups at once. Per group size:
//   wait = (mean iteration time) - burst alone * max(1, ranks of the host / slots) - idle all-reduce
// that is, beyond the burst's time when the host's ranks share its slots perfectly (what the
// simulator's shared-compute bound assumes) and beyond the all-reduce's time when every rank is
// idle in it; the median of five windows' means over a fixed number of iterations (the same on
// every rank: they are collectives), clamped at 0, the slowest rank's figure agreed by a max over
// the world.
//
// Invariants: collective over the world (every rank calls, in the same order). It measures only on
// the CPU, with two ranks or more, where a host's ranks outnumber its compute slots; it returns no
// figure otherwise (an empty table: no wait). The figures are sorted by group size.
#pragma once

#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/cost/cost_model.h"

namespace weft {

// `host_ids`: world_host_ids(); `model`: compute rates, ranks_per_host and compute_slots_per_host
// already measured (the burst is sized from the matmul rate).
std::vector<LoadedWait> measure_loaded_waits(ProcessGroup& world, const std::vector<int>& host_ids,
                                             const CostModel& model);

}  // namespace weft
