// Faults: when one rank fails, every rank stops, soon, with a message naming the failed rank.
//
// - A rank that raises: weft-train's main catches the error and calls abort_all_if_distributed,
//   which prints "rank R: <message>" and calls MPI_Abort(MPI_COMM_WORLD, 1); mpirun then ends every
//   other rank (and names rank R itself).
// - A rank that dies (a signal, the OOM killer): mpirun ends the job when a process exits
//   abnormally. As a backstop for transports where a peer's death leaves others blocked, no
//   collective waits forever: the CPU backend polls its requests and the NCCL backend's watchdog
//   polls events and ncclCommGetAsyncError, both against a deadline of WEFT_COMM_TIMEOUT_S seconds
//   (default 60); past it they call abort_all naming the group, the collective and, where it can
//   tell, the peer that is gone (same-host peers whose process has exited; see
//   describe_failed_peers). Creating an NCCL communicator is bounded the same way
//   (parallel/comm/deadline_broadcast.h), and names the ranks that never arrived.
// - abort_hooks (e.g. ncclCommAbort) run first, for at most a few seconds together, so that devices
//   are released; then MPI_Abort.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace weft {

// Prints "rank R: <message>" to stderr, runs the abort hooks and ends the whole job:
// MPI_Abort(MPI_COMM_WORLD, 1) under MPI with more than one rank, otherwise _Exit(1). Safe from any
// thread; a second concurrent call waits for the first to end the process.
[[noreturn]] void abort_all(const std::string& message);
// abort_all(message) when the world has more than one rank; otherwise returns (a one-process
// program reports the error itself and exits normally).
void abort_all_if_distributed(const std::string& message);

// WEFT_COMM_TIMEOUT_S (seconds, > 0) or 60. Read once.
double comm_timeout_seconds();

// Runs before MPI_Abort in abort_all. Returns an id for remove_abort_hook.
int add_abort_hook(std::function<void()> hook);
void remove_abort_hook(int id);

// Records every world rank's process id and host (collective over MPI_COMM_WORLD; MpiEnvironment
// calls it once) so that a timeout can tell which peer has exited.
void record_peer_processes();
// "rank 1 (pid 4242) has exited" for each of `world_ranks` on this host whose process is gone, and
// "rank 1 (pid 4242) is stopped (SIGSTOP or a debugger)" for each that is stopped; empty when
// neither is known of any.
std::string describe_failed_peers(const std::vector<int>& world_ranks);

}  // namespace weft
