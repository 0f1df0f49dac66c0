// MpiProcessGroup: the CPU backend of ProcessGroup, over an MPI communicator.
//
// Collectives run on the caller's thread (the caller stream) or on a CommStream::cpu thread, one
// at a time in call order per stream, so the main thread computes while MPI moves data. Each
// (group, stream) pair gets its own duplicate of the group's communicator at its first use (MPI
// forbids concurrent collectives on one communicator from several threads); the duplicate is made
// with MPI_Comm_idup, so a first use never blocks the caller.
//
// Every operation is nonblocking MPI (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather,
// MPI_Ibcast, MPI_Isend/Irecv, MPI_Ibarrier) completed by polling MPI_Test against the
// WEFT_COMM_TIMEOUT_S deadline; past it, abort_all names the group, the collective and any peer
// found gone. Dtypes: f32, f64, i32, i64 natively; bf16 and f16 reductions convert to f32, reduce
// and convert back (one rounding), and move as 16-bit words otherwise. An average is the sum
// divided by the group size. An all-reduce of more than 4 MB is several MPI calls of at most 4 MB
// (Open MPI's slows twelvefold from 32 MB), a reduce-scatter of more than 8 MB several of at most
// 8 MB, each packed from every rank's block (Open MPI's slows twentyfold from 16 MB).
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace weft {

class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  // Takes ownership of `comm`, the group's communicator (ranks ordered as `world_ranks`).
  MpiProcessGroup(MPI_Comm comm, std::string name, std::vector<int> world_ranks);
  ~MpiProcessGroup() override;

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device::cpu(); }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }

  CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) override;
  CollectiveHandlePtr reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                     const CommStream& stream) override;
  CollectiveHandlePtr all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) override;
  CollectiveHandlePtr broadcast(const Tensor& tensor, int root, const CommStream& stream) override;
  CollectiveHandlePtr send(const Tensor& tensor, int peer, const CommStream& stream) override;
  CollectiveHandlePtr recv(const Tensor& tensor, int peer, const CommStream& stream) override;
  CollectiveHandlePtr exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor, int recv_peer,
                               const CommStream& stream) override;
  CollectiveHandlePtr barrier(const CommStream& stream) override;

 private:
  // A stream's duplicate of the group communicator. MPI_Comm_idup starts it at the stream's first
  // use (in call order, never blocking the caller); the stream's first operation completes it.
  struct StreamComm {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request pending = MPI_REQUEST_NULL;  // the idup, until completed on the stream
  };
  std::shared_ptr<StreamComm> stream_comm(const CommStream& stream);
  // Runs `body(comm, description)` on `stream` with the stream's communicator.
  CollectiveHandlePtr run(const CommStream& stream, std::string description, int64_t bytes,
                          std::function<void(MPI_Comm, const std::string&)> body);

  MPI_Comm comm_;
  std::string name_;
  std::vector<int> world_ranks_;
  int size_ = 1;
  int rank_ = 0;
  std::mutex comms_mutex_;
  std::map<uint64_t, std::shared_ptr<StreamComm>> stream_comms_;  // by CommStream::id() (0: the caller)
};

// Completes `request` by polling MPI_Test until done or the WEFT_COMM_TIMEOUT_S deadline, which
// aborts the job naming `description` and any peer of `world_ranks` found gone. Between polls it
// yields, and after the first 64 sleeps, doubling from 5 us up to the poll pause limit below.
void wait_for_mpi_request(MPI_Request& request, const std::string& description, const std::vector<int>& world_ranks,
                          MPI_Status* status = MPI_STATUS_IGNORE);

// As wait_for_mpi_request, sleeping at most `pause_limit_us` between polls whatever the process's
// limit (the poll probe times both ways, parallel/comm/mpi_poll_probe.h).
void wait_for_mpi_request_pausing(MPI_Request& request, const std::string& description,
                                  const std::vector<int>& world_ranks, int64_t pause_limit_us,
                                  MPI_Status* status = MPI_STATUS_IGNORE);

// The longest sleep of CPU ranks between two polls, unless the poll probe or the environment says
// otherwise: long enough that a waiting comm thread leaves the cores to compute.
inline constexpr int64_t kCpuMpiPollPauseUs = 200;

// The longest sleep between two polls of wait_for_mpi_request, in microseconds; 0: never sleep,
// only yield. Why it matters: a message that MPI moves in fragments (shared memory without a
// single-copy mechanism, as on the H200 machine) advances only while some MPI call runs, so each
// sleep stalls it; there 200 us sleeps held the pipeline's host route to 0.31 GB/s
// (docs/performance.md, 2026-12-05). CPU ranks start at kCpuMpiPollPauseUs, so that a waiting comm
// thread leaves the cores to compute, and choose_mpi_poll_pause (mpi_poll_probe.h) sets 0 where
// sleeping measurably stalls the world's MPI; processes with GPU ranks never sleep (their host cores
// do not compute): making a process group for a CUDA device sets 0. WEFT_MPI_POLL_PAUSE_US, when
// set, wins over all of these.
int64_t mpi_poll_pause_limit_us();
// Sets the limit unless WEFT_MPI_POLL_PAUSE_US is set (process-wide).
void set_mpi_poll_pause_limit_us(int64_t microseconds);

}  // namespace weft
