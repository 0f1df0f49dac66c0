// HostStagedProcessGroup (host_staged_process_group.h).
#include "parallel/comm/host_staged_process_group.h"

#include <cstdlib>
#include <functional>

#include "runtime/error.h"

#if WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "parallel/comm/cuda_collective_handle.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {

bool gpu_collectives_through_host() {
  const char* value = std::getenv("WEFT_GPU_COLLECTIVES");
  if (value == nullptr || *value == '\0' || std::string(value) == "nccl") return false;
  WEFT_CHECK(std::string(value) == "mpi", "WEFT_GPU_COLLECTIVES='", value,
             "' is not a collective backend; expected WEFT_GPU_COLLECTIVES=nccl (the default) or =mpi (through the "
             "host, so that ranks may share one GPU)");
  return true;
}

HostStagedProcessGroup::HostStagedProcessGroup(std::shared_ptr<ProcessGroup> host_group, Device device)
    : host_(std::move(host_group)), device_(device) {
  WEFT_CHECK(host_ != nullptr && host_->device().is_cpu(), "host-staged group: the host group must be a CPU group");
  WEFT_CHECK(device_.is_cuda(), "host-staged group on ", device_.to_string(), ": a CUDA device is needed");
}

CollectiveHandlePtr HostStagedProcessGroup::staged(
    const CommStream& stream, const std::string& description, const std::vector<Tensor>& inputs,
    const std::vector<Tensor>& outputs,
    const std::function<void(const std::vector<Tensor>&, const std::vector<Tensor>&)>& host_work) {
#if WEFT_HAVE_CUDA
  WEFT_CHECK(!stream.is_cpu_thread(), description, ": a CUDA group cannot run on CPU comm stream '", stream.name(),
             "'; use CommStream::cuda or the caller stream");
  for (const Tensor& tensor : inputs) {
    WEFT_CHECK(tensor.device() == device_, description, ": ", tensor.describe(), " is not on ", device_.to_string());
  }
  cuda::set_device(device_.index);
  cudaStream_t cuda_stream =
      stream.is_cuda() && stream.cuda_stream() ? stream.cuda_stream() : cuda::current_stream(device_.index);
  std::vector<Tensor> keep = inputs;
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  auto handle = std::make_shared<CudaCollectiveHandle>(description, 0, device_.index, cuda_stream, keep);
  cuda::StreamGuard guard(device_.index, cuda_stream);
  // The inputs as the stream has them so far (to(cpu) copies on the current stream, then waits).
  std::vector<Tensor> host_inputs, host_outputs;
  for (const Tensor& tensor : inputs) host_inputs.push_back(tensor.to(Device::cpu()));
  for (const Tensor& tensor : outputs) host_outputs.push_back(Tensor::empty(tensor.shape(), tensor.dtype(), Device::cpu()));
  host_work(host_inputs, host_outputs);
  for (size_t i = 0; i < outputs.size(); ++i) Tensor(outputs[i]).copy_(host_outputs[i]);
  handle->record_end();
  // The copies back may be asynchronous: wait for them here, so that neither the host copies (freed
  // on return) nor the outputs (which a caller may drop with the handle) are reused while in flight.
  // This group is a test mode, not a fast path; the wait costs it nothing that matters.
  WEFT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  return handle;
#else
  WEFT_FAIL(description, ": this build of weft has no CUDA");
#endif
}

CollectiveHandlePtr HostStagedProcessGroup::all_reduce(const Tensor& tensor, Reduction reduction,
                                                       const CommStream& stream) {
  return staged(stream, str("all_reduce over ", name(), " through the host"), {tensor}, {tensor},
                [&](const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                  host_->all_reduce(in[0], reduction, CommStream())->wait();
                  Tensor(out[0]).copy_(in[0]);
                });
}

CollectiveHandlePtr HostStagedProcessGroup::reduce_scatter(const Tensor& input, const Tensor& output,
                                                           Reduction reduction, const CommStream& stream) {
  return staged(stream, str("reduce_scatter over ", name(), " through the host"), {input}, {output},
                [&](const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                  host_->reduce_scatter(in[0], out[0], reduction, CommStream())->wait();
                });
}

CollectiveHandlePtr HostStagedProcessGroup::all_gather(const Tensor& input, const Tensor& output,
                                                       const CommStream& stream) {
  return staged(stream, str("all_gather over ", name(), " through the host"), {input}, {output},
                [&](const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                  host_->all_gather(in[0], out[0], CommStream())->wait();
                });
}

CollectiveHandlePtr HostStagedProcessGroup::broadcast(const Tensor& tensor, int root, const CommStream& stream) {
  return staged(stream, str("broadcast over ", name(), " through the host"), {tensor}, {tensor},
                [&](const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                  host_->broadcast(in[0], root, CommStream())->wait();
                  Tensor(out[0]).copy_(in[0]);
                });
}

CollectiveHandlePtr HostStagedProcessGroup::send(const Tensor& tensor, int peer, const CommStream& stream) {
  return staged(stream, str("send over ", name(), " through the host"), {tensor}, {},
                [&](const std::vector<Tensor>& in, const std::vector<Tensor>&) {
                  host_->send(in[0], peer, CommStream())->wait();
                });
}

CollectiveHandlePtr HostStagedProcessGroup::recv(const Tensor& tensor, int peer, const CommStream& stream) {
  return staged(stream, str("recv over ", name(), " through the host"), {}, {tensor},
                [&](const std::vector<Tensor>&, const std::vector<Tensor>& out) {
                  host_->recv(out[0], peer, CommStream())->wait();
                });
}

CollectiveHandlePtr HostStagedProcessGroup::exchange(const Tensor& send_tensor, int send_peer,
                                                     const Tensor& recv_tensor, int recv_peer,
                                                     const CommStream& stream) {
  return staged(stream, str("exchange over ", name(), " through the host"), {send_tensor}, {recv_tensor},
                [&](const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
                  host_->exchange(in[0], send_peer, out[0], recv_peer, CommStream())->wait();
                });
}

CollectiveHandlePtr HostStagedProcessGroup::barrier(const CommStream& stream) {
  return staged(stream, str("barrier over ", name(), " through the host"), {}, {},
                [&](const std::vector<Tensor>&, const std::vector<Tensor>&) { host_->barrier(CommStream())->wait(); });
}

}  // namespace weft
