// A peer that gets the NCCL unique id but never calls ncclCommInitRank: rank 0 creates the world's
// NCCL communicator (on cuda:0, at its first collective) and must give up once WEFT_COMM_TIMEOUT_S
// has passed, naming the creation, instead of waiting in ncclCommInitRank for ever. The absent rank
// takes part in the id's exchange as NcclProcessGroup's peers do (broadcast_before_deadline over the
// same MPI communicator), then sleeps; it never touches a GPU, so one GPU runs the test.
// tests/distributed/creation_deadline.cc covers a rank absent from the exchange itself, on the CPU.
//   usage (GPU machine): mpirun -np 2 -x WEFT_COMM_TIMEOUT_S=5 nccl_creation_deadline
//   expected: a non-zero exit within the timeout plus a few seconds, rank 0 printing
//   "creating the NCCL communicator of world ... did not complete within 5 s (WEFT_COMM_TIMEOUT_S)"
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "parallel/comm/deadline_broadcast.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/nccl_process_group.h"
#include "runtime/weft.h"

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);
  const std::vector<int> world_ranks = {0, 1};
  if (weft::mpi_world_size() != 2) {
    std::fprintf(stderr, "nccl_creation_deadline: run it with mpirun -np 2\n");
    return 2;
  }
  if (weft::mpi_world_rank() == 1) {
    const double timeout = weft::comm_timeout_seconds();
    ncclUniqueId id{};
    weft::broadcast_before_deadline(
        MPI_COMM_WORLD, &id, static_cast<int>(sizeof(id)),
        std::chrono::steady_clock::now() +
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout)),
        timeout, "the NCCL unique id (test: received, then never used)", world_ranks);
    std::this_thread::sleep_for(std::chrono::hours(1));  // alive, but never initialises its communicator
    return 0;
  }
  try {
    weft::NcclProcessGroup world(MPI_COMM_WORLD, "world", world_ranks, /*device=*/0);
    weft::Tensor value = weft::Tensor::ones({4}, weft::kFloat32, weft::Device::cuda(0));
    world.all_reduce(value, weft::Reduction::kSum, weft::CommStream::caller("test"))->wait();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank 0: unexpected error: %s\n", error.what());
    return 3;
  }
  std::fprintf(stderr, "rank 0: the collective completed, but rank 1 never created its communicator\n");
  return 4;
}
