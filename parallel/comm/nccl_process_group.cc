#if WEFT_HAVE_CUDA && WEFT_HAVE_NCCL

#include "parallel/comm/nccl_process_group.h"

#include <chrono>
#include <cstdlib>

#include "parallel/comm/collective_arguments.h"
#include "parallel/comm/cuda_collective_handle.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/clock.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"

namespace weft {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum: return ncclSum;
    case Reduction::kAverage: return ncclAvg;
    case Reduction::kMax: return ncclMax;
  }
  return ncclSum;
}

size_t count_of(const Tensor& tensor) { return static_cast<size_t>(tensor.numel()); }

}  // namespace

NcclProcessGroup::NcclProcessGroup(MPI_Comm comm, std::string name, std::vector<int> world_ranks, int device)
    : mpi_comm_(comm), name_(std::move(name)), world_ranks_(std::move(world_ranks)), device_(device) {
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));
    WEFT_MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
  }
  WEFT_CHECK(static_cast<int>(world_ranks_.size()) == size_, "process group '", name_, "': ", world_ranks_.size(),
             " world ranks named for a communicator of ", size_);
  cuda::check_device(device_);
  // NVLink multicast (NVLS) can take a shared host's GPUs out of service; weft never asks for it.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  barrier_scratch_ = Tensor::zeros({1}, kFloat32, Device::cuda(device_));
  abort_hook_ = add_abort_hook([this] { abort_communicators(); });
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    stop_condition_.notify_all();
  }
  watchdog_.join();
  remove_abort_hook(abort_hook_);
  for (auto& [stream, comm] : comms_) {
    cudaStreamSynchronize(stream);
    ncclCommDestroy(comm);
  }
  if (mpi_is_active()) {
    MpiCallLock lock;
    MPI_Comm_free(&mpi_comm_);
  }
}

cudaStream_t NcclProcessGroup::resolve(const CommStream& stream, const std::string& description) const {
  WEFT_CHECK(!stream.is_cpu_thread(), description, ": the NCCL process group runs on CUDA streams, not on CPU comm "
             "stream '", stream.name(), "'; use CommStream::cuda or the caller stream");
  if (stream.is_cuda()) {
    WEFT_CHECK(stream.cuda_device() == device_, description, ": stream ", stream.name(),
               " is not on the group's device cuda:", device_);
    if (stream.cuda_stream()) return stream.cuda_stream();
  }
  return cuda::current_stream(device_);
}

ncclComm_t NcclProcessGroup::stream_comm(cudaStream_t stream) {
  // Creation is collective over the group: serialize it in call order on this rank.
  static std::mutex creation_mutex;
  std::lock_guard<std::mutex> creation(creation_mutex);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = comms_.find(stream);
    if (found != comms_.end()) return found->second;
  }
  ncclUniqueId id;
  if (rank_ == 0) WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_comm_));
  }
  cuda::set_device(device_);
  ncclComm_t comm = nullptr;
  WEFT_NCCL_CHECK(ncclCommInitRank(&comm, size_, id, rank_));
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.emplace(stream, comm);
  return comm;
}

CollectiveHandlePtr NcclProcessGroup::launch(const CommStream& stream, const std::string& description, int64_t bytes,
                                             std::vector<Tensor> keep_alive,
                                             const std::function<void(ncclComm_t, cudaStream_t)>& body) {
  cudaStream_t cuda_stream = resolve(stream, description);
  ncclComm_t comm = stream_comm(cuda_stream);
  cuda::set_device(device_);
  auto handle = std::make_shared<CudaCollectiveHandle>(description, bytes, device_, cuda_stream,
                                                       std::move(keep_alive));
  body(comm, cuda_stream);
  handle->record_end();
  std::lock_guard<std::mutex> lock(mutex_);
  outstanding_.push_back({handle, clock_ms()});
  return handle;
}

void NcclProcessGroup::watchdog_loop() {
  const double timeout_ms = comm_timeout_seconds() * 1000.0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    stop_condition_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) return;
    std::string failure;
    const double now = clock_ms();
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      bool done = false;
      try {
        done = it->handle->is_done();
      } catch (const Error& error) {
        failure = str(it->handle->description(), " failed on the GPU: ", error.what());
        break;
      }
      if (done) {
        it = outstanding_.erase(it);
        continue;
      }
      if (now - it->queued_ms > timeout_ms) {
        failure = str(it->handle->description(), " did not complete within ", timeout_ms / 1000.0,
                      " s (WEFT_COMM_TIMEOUT_S)");
        break;
      }
      ++it;
    }
    for (auto& [stream, comm] : comms_) {
      if (!failure.empty()) break;
      ncclResult_t async_error = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async_error) != ncclSuccess) continue;
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        failure = str("NCCL reported an asynchronous error on ", describe(), ": ", ncclGetErrorString(async_error),
                      " (", ncclGetLastError(comm), ")");
      }
    }
    if (failure.empty()) continue;
    lock.unlock();
    const std::string gone = describe_failed_peers(world_ranks_);
    // abort_all runs the abort hooks, ours included (ncclCommAbort), before MPI_Abort.
    abort_all(str(failure, "; ", gone.empty() ? "a peer rank failed or is stuck (no rank of the group on this host "
                                                "has exited)"
                                              : gone));
  }
}

void NcclProcessGroup::abort_communicators() {
  std::vector<ncclComm_t> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [stream, comm] : comms_) comms.push_back(comm);
  }
  for (ncclComm_t comm : comms) ncclCommAbort(comm);
}

CollectiveHandlePtr NcclProcessGroup::all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) {
  check_all_reduce(*this, tensor, reduction);
  const std::string description =
      describe_collective(*this, str("all_reduce(", reduction_name(reduction), ")"), tensor);
  return launch(stream, description, tensor.numel() * tensor.element_size(), {tensor},
                [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), count_of(tensor),
                                                nccl_type(tensor.dtype()), nccl_op(reduction), comm, cuda_stream));
                });
}

CollectiveHandlePtr NcclProcessGroup::reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                                     const CommStream& stream) {
  check_reduce_scatter(*this, input, output, reduction);
  const std::string description =
      describe_collective(*this, str("reduce_scatter(", reduction_name(reduction), ")"), input);
  return launch(stream, description, input.numel() * input.element_size(), {input, output},
                [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclReduceScatter(input.raw_data(), output.raw_data(), count_of(output),
                                                    nccl_type(input.dtype()), nccl_op(reduction), comm, cuda_stream));
                });
}

CollectiveHandlePtr NcclProcessGroup::all_gather(const Tensor& input, const Tensor& output,
                                                 const CommStream& stream) {
  check_all_gather(*this, input, output);
  return launch(stream, describe_collective(*this, "all_gather", input), input.numel() * input.element_size(),
                {input, output}, [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclAllGather(input.raw_data(), output.raw_data(), count_of(input),
                                                nccl_type(input.dtype()), comm, cuda_stream));
                });
}

CollectiveHandlePtr NcclProcessGroup::broadcast(const Tensor& tensor, int root, const CommStream& stream) {
  const std::string operation = check_broadcast(*this, tensor, root);
  return launch(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
                {tensor}, [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), count_of(tensor),
                                                nccl_type(tensor.dtype()), root, comm, cuda_stream));
                });
}

CollectiveHandlePtr NcclProcessGroup::send(const Tensor& tensor, int peer, const CommStream& stream) {
  const std::string operation = check_send(*this, tensor, peer);
  return launch(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
                {tensor}, [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclSend(tensor.raw_data(), count_of(tensor), nccl_type(tensor.dtype()), peer, comm,
                                           cuda_stream));
                });
}

CollectiveHandlePtr NcclProcessGroup::recv(const Tensor& tensor, int peer, const CommStream& stream) {
  const std::string operation = check_recv(*this, tensor, peer);
  return launch(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
                {tensor}, [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclRecv(tensor.raw_data(), count_of(tensor), nccl_type(tensor.dtype()), peer, comm,
                                           cuda_stream));
                });
}

CollectiveHandlePtr NcclProcessGroup::exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor,
                                               int recv_peer, const CommStream& stream) {
  const std::string operation = check_exchange(*this, send_tensor, send_peer, recv_tensor, recv_peer);
  return launch(stream, describe_collective(*this, operation, send_tensor),
                send_tensor.numel() * send_tensor.element_size(), {send_tensor, recv_tensor},
                [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclGroupStart());
                  // Close the group whatever happens, or every later NCCL call of this thread would
                  // be folded into a group that never launches.
                  ncclResult_t result = ncclSend(send_tensor.raw_data(), count_of(send_tensor),
                                                 nccl_type(send_tensor.dtype()), send_peer, comm, cuda_stream);
                  if (result == ncclSuccess) {
                    result = ncclRecv(recv_tensor.raw_data(), count_of(recv_tensor), nccl_type(recv_tensor.dtype()),
                                      recv_peer, comm, cuda_stream);
                  }
                  const ncclResult_t ended = ncclGroupEnd();
                  WEFT_NCCL_CHECK(result);
                  WEFT_NCCL_CHECK(ended);
                });
}

CollectiveHandlePtr NcclProcessGroup::barrier(const CommStream& stream) {
  // NCCL has no barrier: a one-element all-reduce orders every rank the same way.
  return launch(stream, describe_collective(*this, "barrier", Tensor()), 0, {barrier_scratch_},
                [&](ncclComm_t comm, cudaStream_t cuda_stream) {
                  WEFT_NCCL_CHECK(ncclAllReduce(barrier_scratch_.raw_data(), barrier_scratch_.raw_data(), 1,
                                                ncclFloat32, ncclSum, comm, cuda_stream));
                });
}

}  // namespace weft

#endif  // WEFT_HAVE_CUDA && WEFT_HAVE_NCCL
