// world_host_ids and its helpers (host_topology.h).
#include "parallel/cost/host_topology.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>

#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

namespace weft {

std::vector<int> world_host_ids() {
  const bool distributed = mpi_is_active() && mpi_world_size() > 1;
  const int size = distributed ? mpi_world_size() : 1;
  std::vector<int> hosts(static_cast<size_t>(size), 0);
  if (const char* text = std::getenv("WEFT_RANKS_PER_HOST"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long per_host = std::strtol(text, &end, 10);
    WEFT_CHECK(end != nullptr && *end == '\0' && per_host >= 1, "WEFT_RANKS_PER_HOST='", text,
               "' is not a positive whole number of ranks per host");
    for (int r = 0; r < size; ++r) hosts[static_cast<size_t>(r)] = r / static_cast<int>(per_host);
    return hosts;
  }
  if (!distributed) return hosts;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME, '\0');
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Get_processor_name(name, &length));
    WEFT_MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                                 MPI_CHAR, MPI_COMM_WORLD));
  }
  std::map<std::string, int> ids;
  for (int r = 0; r < size; ++r) {
    const std::string host(names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    const auto [found, inserted] = ids.emplace(host, static_cast<int>(ids.size()));
    hosts[static_cast<size_t>(r)] = found->second;
  }
  return hosts;
}

int ranks_per_host(const std::vector<int>& host_ids) {
  std::map<int, int> counts;
  for (int host : host_ids) ++counts[host];
  int most = 0;
  for (const auto& [host, count] : counts) most = std::max(most, count);
  return most;
}

std::vector<int> hosts_of(const std::vector<int>& world_ranks, const std::vector<int>& host_ids) {
  std::vector<int> hosts;
  for (int rank : world_ranks) {
    WEFT_CHECK(rank >= 0 && static_cast<size_t>(rank) < host_ids.size(), "hosts_of: world rank ", rank,
               " is outside the world of ", host_ids.size());
    hosts.push_back(host_ids[static_cast<size_t>(rank)]);
  }
  return hosts;
}

bool first_rank_of_host(const std::vector<int>& host_ids, int rank) {
  for (int r = 0; r < rank; ++r) {
    if (host_ids[static_cast<size_t>(r)] == host_ids[static_cast<size_t>(rank)]) return false;
  }
  return true;
}

}  // namespace weft
