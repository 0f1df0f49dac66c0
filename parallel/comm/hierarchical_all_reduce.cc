// HierarchicalAllReduce (hierarchical_all_reduce.h).
#include "parallel/comm/hierarchical_all_reduce.h"

#include <map>

#include "runtime/error.h"

namespace weft {

std::string HierarchicalAllReduce::unsuitable(const ProcessGroup& group, const std::vector<int>& host_ids) {
  std::map<int, int> per_host;
  for (int rank : group.world_ranks()) {
    if (static_cast<size_t>(rank) >= host_ids.size()) return "the hosts of its ranks are unknown";
    ++per_host[host_ids[static_cast<size_t>(rank)]];
  }
  if (per_host.size() < 2) return str("its ", group.size(), " ranks are on one host");
  for (const auto& [host, count] : per_host) {
    if (count != per_host.begin()->second) return "its hosts hold different numbers of its ranks";
  }
  if (per_host.begin()->second < 2) return "each host holds one of its ranks";
  return "";
}

std::shared_ptr<HierarchicalAllReduce> HierarchicalAllReduce::make(const ProcessGroup& group, int group_index,
                                                                   const std::vector<int>& host_ids) {
  const bool suitable = unsuitable(group, host_ids).empty();
  const int me = group.world_ranks()[static_cast<size_t>(group.rank())];
  const int host = host_ids[static_cast<size_t>(me)];
  int place = 0;  // this rank's place among the group's ranks on its host
  for (int rank : group.world_ranks()) {
    if (rank == me) break;
    place += host_ids[static_cast<size_t>(rank)] == host;
  }
  // Colours unique per (group, host) and per (group, place); every world rank splits twice.
  constexpr int kStride = 1 << 16;
  std::shared_ptr<ProcessGroup> on_host =
      make_split_process_group(group_index * kStride + host, group.name() + "_host", group.device());
  std::shared_ptr<ProcessGroup> across =
      make_split_process_group(group_index * kStride + place, group.name() + "_across_hosts", group.device());
  if (!suitable) return nullptr;
  return std::shared_ptr<HierarchicalAllReduce>(new HierarchicalAllReduce(std::move(on_host), std::move(across)));
}

CollectiveHandlePtr HierarchicalAllReduce::all_reduce(const Tensor& tensor, Reduction reduction,
                                                      const CommStream& stream) {
  const int64_t local = host_->size();
  WEFT_CHECK(tensor.numel() % local == 0, "hierarchical all-reduce: ", tensor.numel(), " elements do not split over the ",
             local, " ranks of a host; pad the tensor to a multiple of ", local);
  Tensor flat = tensor.reshape({tensor.numel()});
  Tensor shard = Tensor::empty({tensor.numel() / local}, tensor.dtype(), tensor.device());
  // Averages compose: a mean over the host's L ranks, then over the H hosts, is the mean of all.
  host_->reduce_scatter(flat, shard, reduction, stream);
  across_->all_reduce(shard, reduction, stream);
  return host_->all_gather(shard, flat, stream);
}

}  // namespace weft
