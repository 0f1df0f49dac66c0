// measure_loaded_waits (loaded_wait_calibration.h).
#include "parallel/cost/loaded_wait_calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "parallel/cost/calibration.h"
#include "parallel/cost/host_topology.h"
#include "runtime/clock.h"
#include "runtime/ops/matmul.h"
#include "runtime/tensor.h"

namespace weft {
namespace {

// The compute one rank runs alone between two collectives: about what a step of the small models
// weft plans on CPU hosts runs between two tensor-parallel collectives (a linear or an attention of
// a micro-batch's shard). The wait grows with it: on the 2-core dev box, 0.1 ms bursts measured
// 0.0-0.3 ms over 2 ranks and 0.05-0.9 ms over 4, 0.2 ms bursts 0.0-0.6 and 0.3-1.3 ms, 1.5 ms
// bursts 3-6 ms (docs/performance.md): the burst must be a step's, not longer.
constexpr double kBurstMs = 0.1;
// The burst alone is timed over at least this long (sustained_mean_ms), as the compute rates are.
constexpr double kAloneMs = 25.0;
// Iterations of burst and collective are timed for about this long per group size, in kWindows
// windows whose median mean is kept: the scheduling regime moves within a few time slices, so a
// mean over many of them is steadier than any one, and the median drops a window that a
// neighbouring process disturbed.
constexpr double kTimedMs = 200.0;
constexpr int kWindows = 5;
constexpr int kLeastIterations = 5 * kWindows;
constexpr int kMostIterations = 1000;
constexpr int kWarmUpIterations = 3;
// The idle all-reduce: the fastest of a few, as the link calibration times its collectives.
constexpr int kIdleRepeats = 5;

// The fastest of kIdleRepeats all-reduces of `value` over `group`, every rank idle in them.
double idle_all_reduce_ms(ProcessGroup& group, const Tensor& value) {
  double best = std::numeric_limits<double>::infinity();
  group.all_reduce(value, Reduction::kSum, CommStream())->synchronize();
  for (int i = 0; i < kIdleRepeats; ++i) {
    group.barrier(CommStream())->synchronize();
    const double start = clock_ms();
    group.all_reduce(value, Reduction::kSum, CommStream())->synchronize();
    best = std::min(best, clock_ms() - start);
  }
  return best;
}

}  // namespace

std::vector<LoadedWait> measure_loaded_waits(ProcessGroup& world, const std::vector<int>& host_ids,
                                             const CostModel& model) {
  const int ranks = world.size();
  const Device device = world.device();
  const double slots = model.compute_slots_per_host;
  if (!device.is_cpu() || ranks < 2 || slots <= 0 || model.ranks_per_host <= slots) return {};
  const int me = world.rank();
  const bool first_of_host = first_rank_of_host(host_ids, me);

  // The burst: n x n by n x n, n from the measured matmul rate (the same on every rank: the rates
  // were agreed by a max), then timed on each host's first rank alone while the others wait in a
  // barrier, as the compute rates are.
  const double flops = kBurstMs * model.compute.matmul_flops_per_ms;
  const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(std::cbrt(flops / 2.0)), 16, 1024);
  const Tensor a = Tensor::normal({n, n}, 1, 4, 0.0, 1.0, kFloat32, device);
  const Tensor b = Tensor::normal({n, n}, 1, 5, 0.0, 1.0, kFloat32, device);
  auto burst = [&] { linear(a, b); };
  world.barrier(CommStream())->synchronize();
  double alone_ms = first_of_host ? sustained_mean_ms(burst, kAloneMs) : 0.0;
  world.barrier(CommStream())->synchronize();
  alone_ms = slowest_over(world, {alone_ms})[0];
  const double sharing = std::max(1.0, static_cast<double>(model.ranks_per_host) / slots);
  const double shared_ms = alone_ms * sharing;
  const int iterations =
      std::clamp(static_cast<int>(kTimedMs / std::max(shared_ms, 0.05)), kLeastIterations, kMostIterations);

  // Group sizes: 2, 4, 8, ... below the world, then the world; ranks r / size together, as a
  // step's tensor-parallel groups (innermost in the mesh) are.
  std::vector<int> sizes;
  for (int size = 2; size < ranks; size *= 2) sizes.push_back(size);
  sizes.push_back(ranks);
  std::vector<double> waits;
  const Tensor value = Tensor::ones({2}, kFloat32, device);  // 8 bytes, a loss's all-reduce
  for (int size : sizes) {
    std::shared_ptr<ProcessGroup> split;
    ProcessGroup* group = &world;
    if (size < ranks) {
      split = make_split_process_group(me / size, "loaded_wait_" + std::to_string(size), device);
      group = split.get();
    }
    const double idle_ms = idle_all_reduce_ms(*group, value);
    auto iteration = [&] {
      burst();
      group->all_reduce(value, Reduction::kSum, CommStream())->synchronize();
    };
    for (int i = 0; i < kWarmUpIterations; ++i) iteration();
    world.barrier(CommStream())->synchronize();  // every group starts loaded at once
    std::vector<double> window_means;
    for (int window = 0; window < kWindows; ++window) {
      const double start = clock_ms();
      for (int i = 0; i < iterations / kWindows; ++i) iteration();
      window_means.push_back((clock_ms() - start) / (iterations / kWindows));
    }
    std::sort(window_means.begin(), window_means.end());
    const double mean_ms = window_means[kWindows / 2];
    world.barrier(CommStream())->synchronize();
    waits.push_back(std::max(0.0, mean_ms - shared_ms - idle_ms));
  }
  waits = slowest_over(world, waits);
  std::vector<LoadedWait> table;
  for (size_t i = 0; i < sizes.size(); ++i) table.push_back({sizes[i], waits[i]});
  return table;
}

}  // namespace weft
