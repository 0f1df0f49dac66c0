// calibrate (calibration.h).
#include "parallel/cost/calibration.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <functional>
#include <set>
#include <limits>

#include "absl/strings/str_format.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "parallel/cost/host_topology.h"
#include "parallel/cost/loaded_wait_calibration.h"
#include "parallel/pipeline/host_message_buffers.h"
#include "runtime/backend.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/tensor.h"

namespace weft {
namespace {

constexpr int kRepeats = 3;

// Compute is timed over a sustained stretch (sustained_mean_ms).
constexpr double kSustainedMs = 25.0;
double mean_ms(const std::function<void()>& run) { return sustained_mean_ms(run, kSustainedMs); }

// The fastest of kRepeats runs of `run` after one warm-up: a collective's own cost, without the
// waits for ranks that arrive late.
double best_ms(const std::function<void()>& run) {
  run();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kRepeats; ++i) {
    const double start = clock_ms();
    run();
    best = std::min(best, clock_ms() - start);
  }
  return best;
}

std::vector<int64_t> message_sizes(Device device, CollectiveKind kind) {
  if (device.is_cpu()) return {int64_t{16} << 10, int64_t{256} << 10, int64_t{1} << 20, int64_t{4} << 20};
  // The host route through host memory moves a small fraction of NCCL's bandwidth (4 GB/s on the
  // H200 machine): NCCL's sizes would add most of a second to start-up; its fit is linear.
  if (kind == CollectiveKind::kHostSendRecv) return {int64_t{1} << 20, int64_t{4} << 20, int64_t{8} << 20};
  return {int64_t{1} << 20, int64_t{8} << 20, int64_t{32} << 20, int64_t{64} << 20};
}

// Times of `kind` over `group` at each size of `sizes` (bytes of the whole buffer), this rank's.
// `host_group`: the same ranks over MPI in host memory, which the pipeline's host route takes (the
// group itself on the CPU).
std::vector<double> time_collective(ProcessGroup& group, ProcessGroup& host_group, CollectiveKind kind,
                                    const std::vector<int64_t>& sizes) {
  std::vector<double> times;
  const Device device = group.device();
  const int64_t p = group.size();
  HostMessageBuffers staging;  // the host route's page-locked buffers (GPUs)
  for (int64_t bytes : sizes) {
    const int64_t elements = std::max<int64_t>(bytes / 4 / p, 1) * p;  // f32, a multiple of the group size
    Tensor full = Tensor::ones({elements}, kFloat32, device);
    Tensor chunk = Tensor::ones({elements / p}, kFloat32, device);
    // Neighbours exchange messages (0-1, 2-3, ...); an odd last rank has no partner and times nothing.
    const int partner = group.rank() ^ 1;
    std::function<void()> run;
    switch (kind) {
      case CollectiveKind::kAllReduce:
        run = [&] { group.all_reduce(full, Reduction::kSum, CommStream())->synchronize(); };
        break;
      case CollectiveKind::kReduceScatter:
        run = [&] { group.reduce_scatter(full, chunk, Reduction::kSum, CommStream())->synchronize(); };
        break;
      case CollectiveKind::kAllGather:
        run = [&] { group.all_gather(chunk, full, CommStream())->synchronize(); };
        break;
      case CollectiveKind::kSendRecv: {
        Tensor received = Tensor::empty({elements}, kFloat32, device);
        run = [&, partner, received] {
          if (partner < group.size()) group.exchange(full, partner, received, partner, CommStream())->synchronize();
        };
        break;
      }
      case CollectiveKind::kHostSendRecv: {
        // As PipelineTransport's host route carries a message: the tensor copied to host memory
        // (waiting for the device), MPI between the hosts' memories, the copy to the device; on
        // GPUs staged in buffers used again, as the route's are (the warm-up run makes them).
        run = [&, partner, elements] {
          if (partner >= group.size()) return;
          const bool staged = !device.is_cpu();
          Tensor sent = staged ? staging.acquire({elements}, kFloat32) : full;
          if (staged) sent.copy_(full);
          Tensor received = staged ? staging.acquire({elements}, kFloat32)
                                   : Tensor::empty({elements}, kFloat32, Device::cpu());
          host_group.exchange(sent, partner, received, partner, CommStream())->synchronize();
          if (staged) {
            // Straight from the page-locked buffer, as the route's receive uploads it.
            const Tensor arrived = Tensor::empty({elements}, kFloat32, device);
            staging.upload_and_release(received, arrived);
            backend_for(device).synchronize(device);
            staging.release(sent);
          }
        };
        break;
      }
    }
    group.barrier(CommStream())->synchronize();  // start together
    times.push_back(best_ms(run));
  }
  return times;
}

// Fits every collective kind over `group` (`host_group`: the same ranks over MPI in host memory)
// into `model` under the class `link`.
void measure_links(ProcessGroup& group, ProcessGroup& host_group, ProcessGroup& world, LinkClass link, Device device,
                   CostModel& model) {
  for (CollectiveKind kind : kAllCollectiveKinds) {
    const std::vector<int64_t> sizes = message_sizes(device, kind);
    const bool message = kind == CollectiveKind::kSendRecv || kind == CollectiveKind::kHostSendRecv;
    const int ranks = message ? 2 : group.size();
    const std::vector<double> times = slowest_over(world, time_collective(group, host_group, kind, sizes));
    std::vector<CollectiveSample> samples;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t p = group.size();
      const double bytes = static_cast<double>(std::max<int64_t>(sizes[i] / 4 / p, 1) * p * 4);
      samples.push_back({bytes, times[i]});
    }
    model.fits[static_cast<size_t>(kind)][static_cast<size_t>(link)] = fit_collective(kind, ranks, samples);
    model.measured[static_cast<size_t>(kind)][static_cast<size_t>(link)] = true;
  }
}

// GPUs' host route where nothing was measured: the H200 machine's
// (docs/performance.md, 2026-12-05, ninth to eleventh sessions). The route: the calibration's own
// fit of it there (tools/device/pipeline-host-route, eleventh session: 0.106 ms + 3.39 GB/s, the
// whole route as weft runs it at 1-8 MB, headers and upload included). Its legs timed apart
// (tools/cuda_host_route_benchmark, page-locked buffers used again) add up to about 4.2 GB/s, the
// default before. (Before GPU processes stopped sleeping between MPI polls it moved 0.31 GB/s.)
constexpr CollectiveFit kGpuHostRouteSameHost = {0.106, 3.39e6, 0};

// default_cost_model's links (calibration.h).
void set_default_links(Device device, CostModel& model) {
  for (CollectiveKind kind : kAllCollectiveKinds) {
    CollectiveFit same_host;
    CollectiveFit across_hosts;
    if (device.is_cpu()) {
      same_host = {0.01, 2e6, 0};
      across_hosts = {0.02, 1e6, 0};
    } else {
      same_host = {0.021, 339e6, 0};
      across_hosts = {0.01, 45e6, 0};
    }
    if (kind == CollectiveKind::kHostSendRecv && !device.is_cpu()) {
      // Across hosts the host route adds the network between its two copies: the latencies add,
      // and so do the times a byte takes on each leg.
      across_hosts = {kGpuHostRouteSameHost.latency_ms + across_hosts.latency_ms,
                      1.0 / (1.0 / kGpuHostRouteSameHost.bytes_per_ms + 1.0 / across_hosts.bytes_per_ms), 0};
      same_host = kGpuHostRouteSameHost;
    }
    model.fits[static_cast<size_t>(kind)][0] = same_host;
    model.fits[static_cast<size_t>(kind)][1] = across_hosts;
  }
}

// The compute rates of one rank alone: only the first rank of each host times (the others wait in
// a barrier, which yields their cores), so that the figures do not depend on how the ranks
// happened to share cores during the measurement; the slowest host's figures are kept.
ComputeRates measure_compute(Device device, DType dtype, const CalibrationShapes& shapes, ProcessGroup& world,
                             bool first_of_host) {
  const int64_t tokens = shapes.batch * shapes.seq_len;
  const int64_t c = shapes.dim;
  const std::vector<std::pair<int64_t, int64_t>> weights = {
      {c, 3 * c}, {c, c}, {c, shapes.hidden}, {shapes.hidden, c}, {c, shapes.vocab}};
  Backend& backend = backend_for(device);
  auto timed = [&](const std::function<void()>& run) {
    return first_of_host ? mean_ms([&backend, device, &run] {
      run();
      backend.synchronize(device);
    })
                         : 0.0;  // loses the max below
  };
  world.barrier(CommStream())->synchronize();
  std::vector<double> times;
  double matmul_flops = 0.0;
  for (const auto& [in, out] : weights) {
    const Tensor x = Tensor::normal({tokens, in}, 1, 0, 0.0, 1.0, dtype, device);
    const Tensor w = Tensor::normal({out, in}, 1, 1, 0.0, 0.02, dtype, device);
    times.push_back(timed([&] { linear(x, w); }));
    matmul_flops += 2.0 * static_cast<double>(tokens) * static_cast<double>(in) * static_cast<double>(out);
  }
  const Tensor q =
      Tensor::normal({shapes.batch, shapes.heads, shapes.seq_len, shapes.head_dim}, 1, 2, 0.0, 1.0, dtype, device);
  times.push_back(timed([&] { causal_attention(q, q, q); }));
  // Counted as stage_partition counts it: 4 * T * width per token (the scores and the weighted sum).
  const double attention_flops =
      4.0 * static_cast<double>(tokens) * static_cast<double>(shapes.seq_len * shapes.heads * shapes.head_dim);
  const int64_t elements = std::max<int64_t>(tokens * c * 4, 1 << 16);
  const Tensor a = Tensor::normal({elements}, 1, 3, 0.0, 1.0, dtype, device);
  times.push_back(timed([&] { add(a, a); }));
  const double elementwise_bytes = 3.0 * static_cast<double>(elements) * dtype_size(dtype);
  // The fixed cost of an op: a hundred adds of one element, launched back to back (on a GPU their
  // launches queue, as a step's kernels do), then one wait.
  constexpr int kTinyOps = 100;
  const Tensor tiny = Tensor::ones({1}, dtype, device);
  times.push_back(timed([&] {
                    for (int i = 0; i < kTinyOps; ++i) add(tiny, tiny);
                  }) /
                  kTinyOps);
  times = slowest_over(world, times);
  double matmul_ms = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) matmul_ms += times[i];
  ComputeRates rates;
  rates.matmul_flops_per_ms = matmul_flops / std::max(matmul_ms, 1e-6);
  rates.attention_flops_per_ms = attention_flops / std::max(times[weights.size()], 1e-6);
  rates.memory_bytes_per_ms = elementwise_bytes / std::max(times[weights.size() + 1], 1e-6);
  rates.op_overhead_ms = times[weights.size() + 2];
  return rates;
}

// The CPU cores the ranks of this rank's host may run on together: the union of their affinity
// masks (mpirun binds each rank to its own core when there are enough, and to none when
// oversubscribed), as a max over the world so that every rank agrees.
int host_cores(ProcessGroup& world, const std::vector<int>& host_ids) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  constexpr int kCores = 1024;  // CPU_SETSIZE
  // One row of core flags per rank, filled in this rank's row; a sum over the world gathers them.
  const int ranks = world.size();
  std::vector<double> flags(static_cast<size_t>(ranks) * kCores, 0.0);
  for (int core = 0; core < kCores; ++core) {
    if (CPU_ISSET(core, &mine)) flags[static_cast<size_t>(world.rank()) * kCores + core] = 1.0;
  }
  if (ranks > 1) {
    Tensor all = Tensor::from_vector(absl::MakeConstSpan(flags), {static_cast<int64_t>(flags.size())}, kFloat64)
                     .to(world.device());
    world.all_reduce(all, Reduction::kSum, CommStream())->synchronize();
    flags = all.to(Device::cpu()).to_vector();
  }
  int most = 0;
  for (int host : std::set<int>(host_ids.begin(), host_ids.end())) {
    int cores = 0;
    for (int core = 0; core < kCores; ++core) {
      bool used = false;
      for (int r = 0; r < ranks; ++r) {
        used = used || (host_ids[static_cast<size_t>(r)] == host && flags[static_cast<size_t>(r) * kCores + core] > 0);
      }
      cores += used;
    }
    most = std::max(most, cores);
  }
  return most;
}

}  // namespace

std::vector<double> slowest_over(ProcessGroup& world, const std::vector<double>& times) {
  if (world.size() == 1 || times.empty()) return times;
  Tensor values = Tensor::from_vector(absl::MakeConstSpan(times), {static_cast<int64_t>(times.size())}, kFloat64)
                      .to(world.device());
  world.all_reduce(values, Reduction::kMax, CommStream())->synchronize();
  return values.to(Device::cpu()).to_vector();
}

double sustained_mean_ms(const std::function<void()>& run, double minimum_ms) {
  run();
  const double start = clock_ms();
  int runs = 0;
  double elapsed = 0.0;
  while (runs < 3 || elapsed < minimum_ms) {
    run();
    ++runs;
    elapsed = clock_ms() - start;
  }
  return elapsed / runs;
}

CostModel default_cost_model(Device device) {
  CostModel model;
  model.device = device.is_cpu() ? "cpu" : "cuda";
  model.source = "defaults (nothing measured)";
  set_default_links(device, model);
  return model;
}

CalibrationResult calibrate(Device device, DType dtype, const CalibrationShapes& shapes, const std::vector<int>& host_ids) {
  const double started = clock_ms();
  CalibrationResult result;
  CostModel& model = result.model;
  model = default_cost_model(device);
  model.dtype = dtype_name(dtype);
  model.ranks_per_host = ranks_per_host(host_ids);
  std::shared_ptr<ProcessGroup> world = make_world_process_group(device);
  const int me = world->rank();
  const bool first_of_host = first_rank_of_host(host_ids, me);
  model.compute = measure_compute(device, dtype, shapes, *world, first_of_host);
  // Each rank has a GPU of its own; CPU ranks share the host's cores (Open MPI binds none when
  // oversubscribed, so each sees them all).
  if (device.is_cpu()) {
    model.compute_slots_per_host = std::min(host_cores(*world, host_ids), std::max(model.ranks_per_host, 1));
  }
  if (world->size() > 1) {
    const LinkClass world_link = link_class_of(host_ids);
    // The host route's messages go over MPI in host memory: on GPUs a CPU group of the same ranks.
    std::shared_ptr<ProcessGroup> host_world = device.is_cpu() ? world : make_world_process_group(Device::cpu());
    measure_links(*world, *host_world, *world, world_link, device, model);
    if (world_link == LinkClass::kAcrossHosts && model.ranks_per_host >= 2) {
      const int host = host_ids[static_cast<size_t>(world->rank())];
      std::shared_ptr<ProcessGroup> same_host = make_split_process_group(host, "host", device);
      std::shared_ptr<ProcessGroup> same_host_memory =
          device.is_cpu() ? same_host : make_split_process_group(host, "host memory", Device::cpu());
      measure_links(*same_host, *same_host_memory, *world, LinkClass::kSameHost, device, model);
    }
    model.fill_unmeasured();
    model.loaded_waits = measure_loaded_waits(*world, host_ids, model);
  }
  result.seconds = (clock_ms() - started) / 1000.0;
  model.source = absl::StrFormat("measured on %d rank(s) of %s (%d per host) in %.2f s", world->size(),
                                 device.to_string(), model.ranks_per_host, result.seconds);
  return result;
}

}  // namespace weft
