// HierarchicalAllReduce: a group's all-reduce in two levels, for a group that spans hosts:
// reduce-scatter among the group's ranks on each host (fast links), all-reduce of each 1/L shard
// among the ranks that hold the same shard on the other hosts (the slow links carry 1/L of the
// bytes), all-gather on each host. The same sum as the flat all-reduce, in another order (f32
// rounding may differ).
//
// Invariants: the group has L >= 2 ranks on each of H >= 2 hosts (every host the same L); the
// reduced tensor's element count is a multiple of L (gradient buckets are padded to a multiple of
// the dp size, which L divides). Its three collectives run on the caller's stream in order, so the
// last one's handle completes the whole.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace weft {

class HierarchicalAllReduce {
 public:
  // Why `group` cannot be reduced in two levels given the world's `host_ids` ("" when it can).
  static std::string unsuitable(const ProcessGroup& group, const std::vector<int>& host_ids);
  // The host and cross-host subgroups of `group`. Collective over the world: every world rank
  // calls it, in the same order, with its own group (a rank whose group is unsuitable still takes
  // part, and gets null).
  static std::shared_ptr<HierarchicalAllReduce> make(const ProcessGroup& group, int group_index,
                                                     const std::vector<int>& host_ids);

  // In place, as ProcessGroup::all_reduce (sum or average).
  CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream);
  int local_size() const { return host_->size(); }
  int hosts() const { return across_->size(); }

 private:
  HierarchicalAllReduce(std::shared_ptr<ProcessGroup> host, std::shared_ptr<ProcessGroup> across)
      : host_(std::move(host)), across_(std::move(across)) {}
  std::shared_ptr<ProcessGroup> host_;    // the group's ranks on this host
  std::shared_ptr<ProcessGroup> across_;  // the group's ranks with this rank's place on the other hosts
};

}  // namespace weft
