// Host topology: which host each world rank runs on, so that the cost model can tell the links
// of one host (NVLink, PCIe, shared memory) from those between hosts.
//
// Hosts come from MPI_Get_processor_name, numbered 0, 1, ... in order of their lowest world rank.
// WEFT_RANKS_PER_HOST=K overrides them with K consecutive world ranks per host (rank r on host
// r / K): it lets one machine play several hosts, to test the across-hosts paths on the CPU. A
// single process is host 0. Collective over the world (every rank calls it, in the same order);
// every rank gets the same answer.
#pragma once

#include <vector>

namespace weft {

// The host id of every world rank, indexed by world rank.
std::vector<int> world_host_ids();
// The ranks of the most populous host (the ranks per host of an even layout).
int ranks_per_host(const std::vector<int>& host_ids);
// The host ids of `world_ranks` (a group's members), from `host_ids`.
std::vector<int> hosts_of(const std::vector<int>& world_ranks, const std::vector<int>& host_ids);
// Whether world rank `rank` is the lowest rank of its host (the one that times compute alone).
bool first_rank_of_host(const std::vector<int>& host_ids, int rank);

}  // namespace weft
