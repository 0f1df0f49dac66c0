// Calibration: measures the collectives of this run's links and the compute at its model's shapes,
// and fits the cost model (cost_model.h) to them.
//
// Collectives: all-reduce, reduce-scatter and all-gather over the whole world, and send/recv
// between neighbouring ranks (0-1, 2-3, ...) over the process group and over the pipeline's host
// route (on GPUs: copied to host memory, MPI, copied back), at a few message sizes (CPU 16 KB to
// 4 MB, GPU 1 MB to 64 MB; the host route on GPUs 1 to 8 MB), each the fastest of a few repeats
// after a warm-up. The world's link class (host_topology.h) is the one fitted; when the world
// spans hosts and a host holds several ranks, the same collectives also run over each host's ranks,
// for the same-host class. Compute: the
// model's linear layers ([tokens, C] by each weight shape), its attention ([B, H, T, D]) and an
// element-wise add, in the run's dtype on its device; on GPUs also one rank's copy of a tensor to
// host memory as the host route makes it (into a page-locked buffer), at the route's sizes.
//
// Collectives are timed on every rank at once, compute on the first rank of each host alone (the
// rate of one rank; CostModel::compute_slots_per_host says how many compute at once), and the
// slowest rank's times are kept, agreed by a max over the world: every rank fits the same model,
// so choices made from it (bucket sizes, paths) agree without further exchange. Collective over
// the world.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/cost/cost_model.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace weft {

// The compute shapes to measure: a micro-batch of the model.
struct CalibrationShapes {
  int64_t batch = 1;       // sequences per micro-batch
  int64_t seq_len = 64;
  int64_t dim = 64;
  int64_t hidden = 256;    // MLP width
  int64_t heads = 4;       // this rank's attention heads
  int64_t head_dim = 16;
  int64_t vocab = 256;
};

struct CalibrationResult {
  CostModel model;
  double seconds = 0.0;    // how long the calibration took
};

// The figures used where nothing was measured (each marked unmeasured): on GPUs the 2 x H200
// NVLink figures of ../shared/device/README.md within a host and a 400 Gb/s InfiniBand port per GPU
// across hosts, and for the pipeline's host route the H200 machine's
// own (docs/performance.md); on the CPU a shared-memory MPI of a few GB/s; compute rates of
// 1 GFLOP/s.
// The mean time of `run` over at least `minimum_ms` (and three runs) after one warm-up. Compute is
// timed over a sustained stretch so that ranks sharing cores each see their share, not the lucky
// moment when the others were descheduled (the fastest of a few runs would).
double sustained_mean_ms(const std::function<void()>& run, double minimum_ms);
// Every rank's `times` replaced by the slowest rank's (a max over `world`, collective), so that
// every rank fits the same model.
std::vector<double> slowest_over(ProcessGroup& world, const std::vector<double>& times);

CostModel default_cost_model(Device device);

// `host_ids`: world_host_ids(). Collective over the world (a single process measures compute only;
// its collective fits stay the defaults, marked unmeasured).
CalibrationResult calibrate(Device device, DType dtype, const CalibrationShapes& shapes, const std::vector<int>& host_ids);

}  // namespace weft
