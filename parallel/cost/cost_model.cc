// CostModel's predictions and the ring-model fit (cost_model.h).
#include "parallel/cost/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "runtime/error.h"

namespace weft {

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kSendRecv: return "send_recv";
    case CollectiveKind::kHostSendRecv: return "host_send_recv";
  }
  return "unknown";
}

CollectiveKind parse_collective_kind(const std::string& name) {
  for (CollectiveKind kind : kAllCollectiveKinds) {
    if (name == collective_kind_name(kind)) return kind;
  }
  WEFT_FAIL("unknown collective kind '", name, "' (all_reduce, reduce_scatter, all_gather, send_recv or host_send_recv)");
}

const char* link_class_name(LinkClass link) {
  return link == LinkClass::kSameHost ? "same_host" : "across_hosts";
}

LinkClass parse_link_class(const std::string& name) {
  if (name == "same_host") return LinkClass::kSameHost;
  if (name == "across_hosts") return LinkClass::kAcrossHosts;
  WEFT_FAIL("unknown link class '", name, "' (same_host or across_hosts)");
}

double collective_steps(CollectiveKind kind, int ranks) {
  const double p = ranks;
  switch (kind) {
    case CollectiveKind::kAllReduce: return 2.0 * (p - 1.0);
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather: return p - 1.0;
    case CollectiveKind::kSendRecv:
    case CollectiveKind::kHostSendRecv: return 1.0;
  }
  return 0.0;
}

double collective_traffic(CollectiveKind kind, int ranks) {
  const double p = ranks;
  switch (kind) {
    case CollectiveKind::kAllReduce: return 2.0 * (p - 1.0) / p;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather: return (p - 1.0) / p;
    case CollectiveKind::kSendRecv:
    case CollectiveKind::kHostSendRecv: return 1.0;
  }
  return 0.0;
}

double CollectiveFit::time_ms(CollectiveKind kind, double bytes, int ranks) const {
  const bool message = kind == CollectiveKind::kSendRecv || kind == CollectiveKind::kHostSendRecv;
  if (ranks <= 1 && !message) return 0.0;
  const int p = std::max(ranks, 2);
  return collective_steps(kind, p) * latency_ms + collective_traffic(kind, p) * bytes / bytes_per_ms;
}

CollectiveFit fit_collective(CollectiveKind kind, int ranks, const std::vector<CollectiveSample>& samples) {
  WEFT_CHECK(!samples.empty(), "fit_collective: no samples of ", collective_kind_name(kind));
  WEFT_CHECK(ranks >= 2, "fit_collective: ", collective_kind_name(kind), " over ", ranks, " rank(s) moves nothing");
  // time = a + c * x with x = traffic * bytes: weighted least squares, weight 1 / time^2 on the
  // squared error (relative errors).
  const double traffic = collective_traffic(kind, ranks);
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const CollectiveSample& sample : samples) {
    const double w = 1.0 / std::max(sample.time_ms * sample.time_ms, 1e-12);
    const double x = traffic * sample.bytes;
    sw += w;
    sx += w * x;
    sy += w * sample.time_ms;
    sxx += w * x * x;
    sxy += w * x * sample.time_ms;
  }
  const double denominator = sw * sxx - sx * sx;
  double slope = denominator > 0 ? (sw * sxy - sx * sy) / denominator : 0.0;
  double intercept = denominator > 0 ? (sy - slope * sx) / sw : sy / sw;
  const auto largest = std::max_element(samples.begin(), samples.end(),
                                        [](const CollectiveSample& a, const CollectiveSample& b) { return a.bytes < b.bytes; });
  if (slope <= 0) {
    // Noise swamped the size dependence: take the bandwidth the largest message showed.
    slope = largest->time_ms / std::max(traffic * largest->bytes, 1.0);
    intercept = 0.0;
  }
  if (intercept < 0) {
    intercept = 0.0;
    slope = largest->time_ms / std::max(traffic * largest->bytes, 1.0);
  }
  CollectiveFit fit;
  fit.latency_ms = intercept / collective_steps(kind, ranks);
  fit.bytes_per_ms = 1.0 / slope;
  fit.measured_ranks = ranks;
  return fit;
}

double CostModel::collective_ms(CollectiveKind kind, double bytes, int ranks, LinkClass link) const {
  if (ranks <= 1) return 0.0;
  return fit(kind, link).time_ms(kind, bytes, ranks);
}

double CostModel::hierarchical_all_reduce_ms(double bytes, int local, int hosts) const {
  return collective_ms(CollectiveKind::kReduceScatter, bytes, local, LinkClass::kSameHost) +
         collective_ms(CollectiveKind::kAllReduce, bytes / std::max(local, 1), hosts, LinkClass::kAcrossHosts) +
         collective_ms(CollectiveKind::kAllGather, bytes, local, LinkClass::kSameHost);
}

double CostModel::loaded_wait_ms(int ranks) const {
  if (ranks < 2 || loaded_waits.empty()) return 0.0;
  if (ranks <= loaded_waits.front().ranks) return loaded_waits.front().wait_ms;
  for (size_t i = 1; i < loaded_waits.size(); ++i) {
    const LoadedWait& below = loaded_waits[i - 1];
    const LoadedWait& above = loaded_waits[i];
    if (ranks <= above.ranks) {
      const double share = static_cast<double>(ranks - below.ranks) / static_cast<double>(above.ranks - below.ranks);
      return below.wait_ms + share * (above.wait_ms - below.wait_ms);
    }
  }
  return loaded_waits.back().wait_ms;
}

void CostModel::fill_unmeasured() {
  for (size_t k = 0; k < kCollectiveKindCount; ++k) {
    for (size_t l = 0; l < kLinkClassCount; ++l) {
      if (!measured[k][l] && measured[k][1 - l]) fits[k][l] = fits[k][1 - l];
    }
  }
}

std::vector<std::string> CostModel::describe() const {
  std::vector<std::string> lines;
  for (CollectiveKind kind : kAllCollectiveKinds) {
    for (LinkClass link : {LinkClass::kSameHost, LinkClass::kAcrossHosts}) {
      const CollectiveFit& f = fit(kind, link);
      const bool was_measured = measured[static_cast<size_t>(kind)][static_cast<size_t>(link)];
      lines.push_back(absl::StrFormat("%-14s %-12s %.4f ms/step + %.3f GB/s%s", collective_kind_name(kind),
                                      link_class_name(link), f.latency_ms, f.bytes_per_ms / 1e6,
                                      was_measured ? absl::StrFormat(" (measured on %d ranks)", f.measured_ranks)
                                                   : std::string(" (assumed: not measured)")));
    }
  }
  // flops per ms / 1e9 is TFLOP/s; GPUs are read in those, CPUs in GFLOP/s.
  auto rate = [](double flops_per_ms) {
    return flops_per_ms >= 1e9 ? absl::StrFormat("%.1f TFLOP/s", flops_per_ms / 1e9)
                               : absl::StrFormat("%.2f GFLOP/s", flops_per_ms / 1e6);
  };
  lines.push_back(absl::StrFormat("compute: matmul %s, attention %s, element-wise %.2f GB/s, %.1f us per op (%s)",
                                  rate(compute.matmul_flops_per_ms), rate(compute.attention_flops_per_ms),
                                  compute.memory_bytes_per_ms / 1e6, compute.op_overhead_ms * 1000.0, dtype));
  if (compute.scale != 1.0) {
    lines.push_back(absl::StrFormat("compute: x %.2f, the model's own micro-batch measured against these rates", compute.scale));
  }
  if (compute_slots_per_host > 0) {
    lines.push_back(absl::StrFormat("compute: %.1f rank(s) of a host compute at full speed at once (of %d)",
                                    compute_slots_per_host, ranks_per_host));
  }
  if (!loaded_waits.empty()) {
    std::string waits;
    for (const LoadedWait& wait : loaded_waits) {
      waits += absl::StrFormat("%s%.3f ms over %d ranks", waits.empty() ? "" : ", ", wait.wait_ms, wait.ranks);
    }
    lines.push_back("loaded wait: a collective reached from compute on an oversubscribed host waits " + waits +
                    " beyond its fit");
  }
  return lines;
}

LinkClass link_class_of(const std::vector<int>& hosts) {
  for (int host : hosts) {
    if (host != hosts.front()) return LinkClass::kAcrossHosts;
  }
  return LinkClass::kSameHost;
}

}  // namespace weft
