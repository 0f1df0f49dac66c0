// CostModel: what weft knows about the speed of its links and its compute, measured (calibration.h)
// or read from a file (launcher/calibration_file.h), and the predictions made from it.
//
// Collectives follow the ring model, fitted per collective kind and link class:
//   time(kind, bytes, ranks) = steps(kind, ranks) * latency_ms + traffic(kind, ranks) * bytes / bytes_per_ms
// where `bytes` is the whole buffer (the all-reduced tensor, reduce-scatter's input, all-gather's
// output, the message of a send) and, for p = ranks,
//   all_reduce:     steps 2(p-1), traffic 2(p-1)/p    (a reduce-scatter then an all-gather)
//   reduce_scatter: steps p-1,    traffic (p-1)/p
//   all_gather:     steps p-1,    traffic (p-1)/p
//   send_recv:      steps 1,      traffic 1
//   host_send_recv: steps 1,      traffic 1
// so bytes_per_ms is the bus bandwidth (NCCL's busbw) and latency_ms the cost of one ring step.
// A fit measured at one group size predicts another (a 2-GPU calibration plans a 1024-GPU run);
// MPI's algorithms are not all rings, so on the CPU the fit is exact only near the measured size.
//
// send_recv is a message between two ranks' buffers as the process groups carry it (NCCL device to
// device on GPUs, MPI on the CPU): the pipeline's direct route. host_send_recv is a message of the
// pipeline's host route (parallel.pp_transport host): on GPUs the sender's copy to host memory, MPI
// between the two hosts' memories and the receiver's copy to its device, end to end; on the CPU it
// is MPI's message, as send_recv. The sender's copy runs on a copy stream and its MPI send on a
// thread of the transport (parallel/pipeline/staged_send_queue.h), so no part of a host-route
// message holds the sender's compute: the route costs its transfer, as the direct route does.
// (Until 2026-12-05 the sender copied on its issuing thread, and a `device_to_host` figure kept
// that copy apart as the part no comm mode hid; calibration files may still carry it, unread.)
//
// Link classes: ranks on one host (NVLink, PCIe or shared memory) and ranks on different hosts. A
// group uses the class of its slowest pair: across hosts as soon as it spans two. A class that was
// never measured falls back to the other's fit, marked `assumed` in describe().
//
// Compute: dense matmul FLOP rate and attention FLOP rate at the model's shapes, and the memory
// bandwidth of element-wise work (norms, activations, the optimizer), each an effective rate that
// includes kernel launch and framework overheads at those shapes.
//
// Loaded wait: on a host whose ranks outnumber its compute slots (CPU ranks on fewer cores), a
// collective or a receive that ranks reach from compute costs more than the fit says, which is
// measured with every rank idle in the collective: the ranks arrive apart (each got another share
// of the cores) and a peer that is descheduled must be scheduled again before anyone proceeds.
// That extra time, per collective and by group size, is measured by loaded_wait_calibration.h and
// paid by the step simulator only where a host's ranks exceed its slots.
//
// Invariants: every rate and bandwidth is positive; latencies and loaded waits are non-negative;
// loaded waits are sorted by group size, each size once.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace weft {

enum class CollectiveKind : uint8_t { kAllReduce, kReduceScatter, kAllGather, kSendRecv, kHostSendRecv };
constexpr int kCollectiveKindCount = 5;
inline constexpr std::array<CollectiveKind, kCollectiveKindCount> kAllCollectiveKinds = {
    CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather, CollectiveKind::kSendRecv,
    CollectiveKind::kHostSendRecv};
// "all_reduce", "reduce_scatter", "all_gather", "send_recv", "host_send_recv".
const char* collective_kind_name(CollectiveKind kind);
// The inverse; throws weft::Error for another name.
CollectiveKind parse_collective_kind(const std::string& name);

enum class LinkClass : uint8_t { kSameHost, kAcrossHosts };
constexpr int kLinkClassCount = 2;
// "same_host", "across_hosts".
const char* link_class_name(LinkClass link);
LinkClass parse_link_class(const std::string& name);

// Ring steps and traffic factor of `kind` over `ranks` (file comment).
double collective_steps(CollectiveKind kind, int ranks);
double collective_traffic(CollectiveKind kind, int ranks);

struct CollectiveFit {
  double latency_ms = 0.0;    // per ring step
  double bytes_per_ms = 1.0;  // bus bandwidth
  int measured_ranks = 0;     // the group size it was measured on (0: not measured)
  double time_ms(CollectiveKind kind, double bytes, int ranks) const;
};

// One timed collective, for fitting: the whole buffer's bytes and the time over `ranks`.
struct CollectiveSample {
  double bytes = 0.0;
  double time_ms = 0.0;
};

// The least-squares fit of `samples` (all of `kind` over `ranks` ranks) to the ring model, each
// sample weighted by 1 / time so that small and large messages count alike. A negative intercept
// or slope (noise) is clamped: latency 0, or bandwidth from the largest sample. Throws weft::Error
// without samples or with ranks < 2 (a collective of one rank moves nothing).
CollectiveFit fit_collective(CollectiveKind kind, int ranks, const std::vector<CollectiveSample>& samples);

struct ComputeRates {
  double matmul_flops_per_ms = 1e6;
  double attention_flops_per_ms = 1e6;
  double memory_bytes_per_ms = 1e6;  // element-wise work, bytes read plus written
  double op_overhead_ms = 0.0;       // fixed cost of one op (launch, dispatch, autograd), whatever its size
  // Measured / modelled time of one micro-batch of the run's own model, forward and backward, on
  // one rank (launcher/compute_anchor.h): what the rates above miss at the model's real ops (the
  // autograd, the allocations, many small ops). Every compute duration is multiplied by it; 1 where
  // it was not measured.
  double scale = 1.0;
};

// The loaded wait (file comment) of one collective over `ranks` ranks that arrive from compute.
struct LoadedWait {
  int ranks = 2;
  double wait_ms = 0.0;
};

struct CostModel {
  std::string device;       // "cpu" or "cuda" (what the figures were measured on)
  std::string dtype;        // the compute dtype of the compute rates
  std::string source;       // where the figures come from ("measured on 4 ranks, 2026-12-02 ...", a file)
  int ranks_per_host = 0;   // of the calibrating run (0: unknown)
  // How many ranks of one host compute at full speed at once: on the CPU its cores (ranks beyond
  // them share), 0 where each rank has a device of its own. The compute rates are those of a rank
  // computing alone.
  double compute_slots_per_host = 0.0;
  // fits[kind][link]; `measured` says which were measured (the others are copied, see file comment).
  std::array<std::array<CollectiveFit, kLinkClassCount>, kCollectiveKindCount> fits{};
  std::array<std::array<bool, kLinkClassCount>, kCollectiveKindCount> measured{};
  ComputeRates compute;
  // By group size, ascending (empty where the calibrating host was not oversubscribed, on GPUs, or
  // in files older than the figure): what a collective reached from compute waits beyond its fit.
  std::vector<LoadedWait> loaded_waits;

  const CollectiveFit& fit(CollectiveKind kind, LinkClass link) const {
    return fits[static_cast<size_t>(kind)][static_cast<size_t>(link)];
  }
  // 0 for ranks <= 1 (nothing moves).
  double collective_ms(CollectiveKind kind, double bytes, int ranks, LinkClass link) const;
  // Hierarchical all-reduce of `bytes` over `hosts` hosts of `local` ranks each: reduce-scatter on
  // each host, all-reduce of the 1/local shard across hosts, all-gather on each host.
  double hierarchical_all_reduce_ms(double bytes, int local, int hosts) const;
  double matmul_ms(double flops) const { return compute.scale * flops / compute.matmul_flops_per_ms; }
  double attention_ms(double flops) const { return compute.scale * flops / compute.attention_flops_per_ms; }
  double memory_ms(double bytes) const { return compute.scale * bytes / compute.memory_bytes_per_ms; }
  double ops_ms(double ops) const { return compute.scale * ops * compute.op_overhead_ms; }
  // The loaded wait of a collective over `ranks` ranks: 0 below 2 ranks or without figures, linear
  // between measured group sizes, the nearest measured size's figure outside them (a larger group
  // waits for more peers, but how much more was not measured: the smaller figure, not a guess).
  double loaded_wait_ms(int ranks) const;
  // Copies every measured fit into the link class that was not measured (so each is usable).
  void fill_unmeasured();
  // Lines for a log: one per collective kind and link ("all_reduce same_host: 0.012 ms/step +
  // 1.9 GB/s (measured on 2 ranks)"), then the compute rates.
  std::vector<std::string> describe() const;
};

// The class of a group whose ranks sit on `hosts` (a host id per group rank).
LinkClass link_class_of(const std::vector<int>& hosts);

}  // namespace weft
