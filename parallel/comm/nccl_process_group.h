// NcclProcessGroup: the CUDA backend of ProcessGroup, over NCCL.
//
// One NCCL communicator per (group, CUDA stream), created at the stream's first use: group rank 0
// makes an ncclUniqueId, the group's MPI communicator broadcasts it, every rank calls
// ncclCommInitRank on its device. Collectives are queued on the stream and never block the host;
// bf16, f16, f32, f64, i32 and i64 reduce natively (average is ncclAvg).
//
// Faults: NCCL calls return at once, so a peer that died leaves a kernel spinning on the GPU. A
// watchdog thread per group polls every outstanding collective's end event and every communicator's
// ncclCommGetAsyncError; an asynchronous error, or a collective not done WEFT_COMM_TIMEOUT_S seconds
// (default 60) after it was queued, calls ncclCommAbort on the group's communicators and abort_all
// (MPI_Abort) with a message naming the group, the collective and any peer found gone.
//
// WEFT_NCCL_CHECK(call) throws weft::Error with the file, the line, the call and ncclGetErrorString.
#pragma once

#if WEFT_HAVE_CUDA && WEFT_HAVE_NCCL

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/error.h"

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
  // Stops the watchdog and destroys the communicators (after finishing their queued work).
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

 private:
  struct Outstanding {
    std::shared_ptr<CudaCollectiveHandle> handle;
    double queued_ms;
  };
  cudaStream_t resolve(const CommStream& stream, const std::string& description) const;
  ncclComm_t stream_comm(cudaStream_t stream);
  // Queues `body(comm, stream)` as the collective `description` and tracks it in the watchdog.
  CollectiveHandlePtr launch(const CommStream& stream, const std::string& description, int64_t bytes,
                             std::vector<Tensor> keep_alive,
                             const std::function<void(ncclComm_t, cudaStream_t)>& body);
  void watchdog_loop();
  // ncclCommAbort on every communicator (the abort hook).
  void abort_communicators();

  MPI_Comm mpi_comm_;
  std::string name_;
  std::vector<int> world_ranks_;
  int device_;
  int size_ = 1;
  int rank_ = 0;
  Tensor barrier_scratch_;  // f32[1] on the device

  std::mutex mutex_;  // guards comms_, outstanding_, stopping_
  std::map<cudaStream_t, ncclComm_t> comms_;
  std::deque<Outstanding> outstanding_;
  bool stopping_ = false;
  std::condition_variable stop_condition_;
  int abort_hook_ = 0;
  std::thread watchdog_;
};

}  // namespace weft

#endif  // WEFT_HAVE_CUDA && WEFT_HAVE_NCCL
