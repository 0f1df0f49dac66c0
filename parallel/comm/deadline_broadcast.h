// broadcast_before_deadline: rank 0 of an MPI communicator hands a few bytes to every other rank,
// and a rank that never arrives stops the job within the deadline, named.
//
// What it is for: creating an NCCL communicator starts with group rank 0's ncclUniqueId reaching
// every rank of the group over MPI. A plain MPI_Bcast there waits forever for a peer that never
// gets to it (stuck before, or dead on another host), before any collective's deadline applies.
//
// How: every rank but 0 sends rank 0 an "arrived" message and posts the receive of the bytes;
// rank 0 receives the arrivals, then sends the bytes to each rank. All of it is nonblocking MPI,
// polled (MPI_Test, with the backoff of wait_for_mpi_request) against the deadline. Past it, rank 0
// knows which ranks have not arrived and abort_all names them ("world ranks 1, 3 did not arrive");
// another rank can only say that rank 0 never handed the bytes over. The other ranks wait 2 s past
// the deadline, so that rank 0's message, the one that names the missing ranks, comes first. Both
// add WEFT_COMM_TIMEOUT_S and the peers found gone or stopped (describe_failed_peers).
//
// Invariants: the messages use their own tag on `comm`, and calls on one communicator match in
// call order (MPI does not overtake messages between a pair of ranks on one tag and communicator),
// so every rank must make its calls on `comm` in the same order, as any collective. MPI calls are
// made under MpiCallLock. The caller has checked that this thread may call MPI.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

namespace weft {

// Copies `bytes` bytes at `data` on rank 0 of `comm` into `data` on every other rank, or ends the
// job (abort_all) once `deadline` has passed. `description` names what is exchanged ("the NCCL
// unique id of dp (world ranks 0, 1) for stream 7"); `world_ranks[r]` is the world rank of comm's
// rank r; `timeout_seconds` is the deadline's length, for the message.
void broadcast_before_deadline(MPI_Comm comm, void* data, int bytes, std::chrono::steady_clock::time_point deadline,
                               double timeout_seconds, const std::string& description,
                               const std::vector<int>& world_ranks);

}  // namespace weft
