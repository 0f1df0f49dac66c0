// A rank that never arrives at a communicator's creation: every other rank calls
// broadcast_before_deadline (how NcclProcessGroup hands its ncclUniqueId over) on the world, while
// the absent rank sleeps. The job must end within WEFT_COMM_TIMEOUT_S plus a few seconds, rank 0
// naming the ranks that did not arrive (or, when rank 0 is the absent one, another rank saying that
// rank 0 never handed the id over). tests/distributed/expect_failure.sh checks the exit and message.
//   usage: creation_deadline ABSENT_RANK
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "parallel/comm/deadline_broadcast.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);
  const int absent = argc > 1 ? std::atoi(argv[1]) : 1;
  std::vector<int> world_ranks(static_cast<size_t>(weft::mpi_world_size()));
  for (size_t r = 0; r < world_ranks.size(); ++r) world_ranks[r] = static_cast<int>(r);
  if (weft::mpi_world_rank() == absent) {
    std::this_thread::sleep_for(std::chrono::hours(1));  // alive, but never arrives
    return 0;
  }
  const double timeout = weft::comm_timeout_seconds();
  char id[128] = {};
  weft::broadcast_before_deadline(
      MPI_COMM_WORLD, id, sizeof(id),
      std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout)),
      timeout, "creating the NCCL communicator of world (test)", world_ranks);
  return 0;  // not reached: the absent rank never arrives
}
