// NcclProcessGroup: the CUDA backend of ProcessGroup, over NCCL.
//
// One NCCL communicator per (group, CUDA stream), created at the stream's first use: group rank 0
// makes an ncclUniqueId, broadcast_before_deadline hands it to every rank over the group's MPI
// communicator, and every rank calls ncclCommInitRankConfig on its device. Collectives are queued
// on the stream and never block the host for long; bf16, f16, f32, f64, i32 and i64 reduce
// natively (average is ncclAvg).
//
// Communicators are keyed by the stream's process-unique id (cuda::stream_id), never by its
// handle, which CUDA reuses once a stream is destroyed: a reused handle would make this rank take
// the old communicator while its peers, whose new stream got a fresh handle, create one, and both
// would hang. When weft destroys a stream (cuda::Stream, runtime/stream_retirement.h) its
// communicator is set aside, never used again, and destroyed with the group.
//
// Deadlines: creation (the id exchange and the initialisation) and every collective are bounded by
// WEFT_COMM_TIMEOUT_S (default 60; parallel/comm/fault_handler.h). The communicators are
// nonblocking (ncclConfig_t::blocking = 0): ncclCommInitRankConfig returns at once and is polled
// through ncclCommGetAsyncError until ready, failed or past the deadline (then ncclCommAbort and
// abort_all naming the group, the stream and WEFT_COMM_TIMEOUT_S; the id exchange names the ranks
// that did not arrive). A nonblocking communicator may also return ncclInProgress from a collective
// before its kernel is on the stream (connections set up in the background), so every call is
// followed by the same poll, bounded the same way, before the handle's end event is recorded.
//
// Faults after creation: NCCL calls return at once, so a peer that died leaves a kernel spinning on
// the GPU. A CollectiveWatchdog (parallel/comm/collective_watchdog.h) per group polls every
// outstanding collective's end event and every communicator's ncclCommGetAsyncError each 100 ms; a
// failure, or a collective not done WEFT_COMM_TIMEOUT_S after it was queued, calls ncclCommAbort on
// the group's communicators and abort_all (MPI_Abort) with a message naming the group, the
// collective and any peer found gone. The watchdog holds each handle, and so its tensors, until
// the GPU has finished the collective, and lets go of it outside its lock.
//
// Threads: NCCL forbids issuing work to independent communicators of one device from several
// threads at once, and weft may (the direct pipeline route receives on a host worker while the
// issuing thread sends and reduces). Every call that issues work or starts a communicator is made
// under one lock of the process; those calls return at once on nonblocking communicators, and the
// polls that wait for them (and so for peers) run outside it. Creations of one group's
// communicators are serialized on each rank; creations in different groups are not, since each
// waits for its peers and must not hold up another group's creation that a peer may need first.
//
// MPI thread level: creation calls MPI from the thread of the stream's first collective; below
// MPI_THREAD_SERIALIZED that must be the main thread, and any other is refused with a message.
//
// WEFT_NCCL_CHECK(call) throws weft::Error with the file, the line, the call and ncclGetErrorString.
#pragma once

#if WEFT_HAVE_CUDA && WEFT_HAVE_NCCL

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/collective_watchdog.h"
#include "parallel/comm/process_group.h"
#include "runtime/error.h"
#include "runtime/stream_retirement.h"

#define WEFT_NCCL_CHECK(call)                                                                          \
  do {                                                                                                 \
    const ncclResult_t weft_nccl_status = (call);                                                      \
    if (weft_nccl_status != ncclSuccess && weft_nccl_status != ncclInProgress) [[unlikely]] {          \
      WEFT_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ", ncclGetErrorString(weft_nccl_status)); \
    }                                                                                                  \
  } while (0)

namespace weft {

class CudaCollectiveHandle;

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Takes ownership of `comm`, the group's MPI communicator (ranks ordered as `world_ranks`).
  NcclProcessGroup(MPI_Comm comm, std::string name, std::vector<int> world_ranks, int device);
  // Stops the watchdog and destroys the communicators after their queued work (ncclCommFinalize,
  // bounded by WEFT_COMM_TIMEOUT_S; past it, ncclCommAbort).
  ~NcclProcessGroup() override;

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device::cuda(device_); }
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

  // Communicators in use (one per stream used so far, less those of retired streams), and those
  // set aside when weft destroyed their stream: for tests and diagnostics.
  size_t communicator_count();
  size_t retired_communicator_count();

 private:
  // The CUDA stream a call runs on, and its id.
  struct ResolvedStream {
    cudaStream_t stream;
    uint64_t id;
  };
  ResolvedStream resolve(const CommStream& stream, const std::string& description) const;
  // The stream's communicator, created (collectively) at its first use.
  ncclComm_t stream_comm(const ResolvedStream& stream, const std::string& description);
  ncclComm_t create_communicator(const std::string& what);
  // Polls ncclCommGetAsyncError until `comm` is no longer ncclInProgress. An NCCL error is thrown
  // (weft::Error naming `what`); past `deadline`, abort_job names `what` and the timeout.
  void wait_until_ready(ncclComm_t comm, const std::string& what, std::chrono::steady_clock::time_point deadline,
                        double timeout_seconds);
  // Queues `body(comm, stream)` as the collective `description` and tracks it in the watchdog.
  CollectiveHandlePtr launch(const CommStream& stream, const std::string& description, int64_t bytes,
                             std::vector<Tensor> keep_alive,
                             const std::function<void(ncclComm_t, cudaStream_t)>& body);
  // The watchdog's per-round check: ncclCommGetAsyncError of every communicator.
  std::string check_communicators();
  // The watchdog's failure handler: names the peers found gone, then abort_all.
  [[noreturn]] void abort_job(const std::string& failure);
  // ncclCommAbort on every communicator, the one being created included (the abort hook).
  void abort_communicators();
  // A stream weft destroyed: its communicator is set aside (never used again).
  void retire_stream(const StreamKey& stream);

  MPI_Comm mpi_comm_;
  std::string name_;
  std::vector<int> world_ranks_;
  int device_;
  int size_ = 1;
  int rank_ = 0;
  Tensor barrier_scratch_;  // f32[1] on the device

  std::mutex creation_mutex_;  // one creation of this group's communicators at a time on this rank
  std::mutex mutex_;           // guards comms_, retired_comms_, initializing_
  std::map<uint64_t, ncclComm_t> comms_;  // by stream id (cuda::stream_id)
  std::vector<ncclComm_t> retired_comms_;  // of streams weft destroyed; destroyed with the group
  ncclComm_t initializing_ = nullptr;      // the communicator being created, for the abort hook
  int abort_hook_ = 0;
  int retired_listener_ = 0;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // last: destroyed first, before the communicators
};

}  // namespace weft

#endif  // WEFT_HAVE_CUDA && WEFT_HAVE_NCCL
