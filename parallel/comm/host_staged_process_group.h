// HostStagedProcessGroup: a CUDA process group whose collectives go through host memory and MPI,
// so that several ranks may share one GPU (which NCCL refuses: "Duplicate GPU detected").
//
// It is a test mode, not a fast path: `WEFT_GPU_COLLECTIVES=mpi` makes every CUDA group of more
// than one rank one of these (process_group.h), and with `train.device: cuda:0` every rank of a
// one-GPU machine then runs the whole GPU training path, the CUDA executor, its streams and host
// workers, the pipeline's transport, against one process's losses. The multi-GPU layouts are
// checked on the GPU that is there (tools/device/shared-gpu-pass).
//
// Each collective waits on the host for the work queued so far on its stream (the caller's
// current stream, or the CommStream's CUDA stream), copies its tensors to the host, runs the MPI
// group's collective on the calling thread, and copies the result back on that stream; it returns
// a handle whose end event follows the copy. So it blocks the calling thread (on the CUDA executor,
// its issuing thread) for the whole exchange, as an MPI collective on the CPU does; results are
// those of the MPI backend (the same reduction order on every rank).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace weft {

// True where WEFT_GPU_COLLECTIVES=mpi asks CUDA groups to go through the host (anything other than
// unset, "nccl" or "mpi" is refused with a message).
bool gpu_collectives_through_host();

class HostStagedProcessGroup final : public ProcessGroup {
 public:
  // `host_group`: the MPI group of the same ranks (device cpu); `device`: the CUDA device.
  HostStagedProcessGroup(std::shared_ptr<ProcessGroup> host_group, Device device);

  int size() const override { return host_->size(); }
  int rank() const override { return host_->rank(); }
  const std::string& name() const override { return host_->name(); }
  Device device() const override { return device_; }
  const std::vector<int>& world_ranks() const override { return host_->world_ranks(); }

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
  struct Staging;
  // Runs `host_work` between the copies: `inputs` to the host first, then the host copies of
  // `outputs` back into them. `description` names the handle.
  CollectiveHandlePtr staged(const CommStream& stream, const std::string& description, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs,
                             const std::function<void(const std::vector<Tensor>& host_inputs,
                                                      const std::vector<Tensor>& host_outputs)>& host_work);

  std::shared_ptr<ProcessGroup> host_;
  Device device_;
};

}  // namespace weft
