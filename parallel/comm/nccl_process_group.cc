#if WEFT_HAVE_CUDA && WEFT_HAVE_NCCL

#include "parallel/comm/nccl_process_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "parallel/comm/collective_arguments.h"
#include "parallel/comm/cuda_collective_handle.h"
#include "parallel/comm/deadline_broadcast.h"
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
    case DType::kInt16:
      WEFT_FAIL("NCCL has no 16-bit integer type: i16 tensors (the low halves of bf16 master weights) are not sent "
                "over NCCL");
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

// Held around every call into NCCL that issues work or starts a communicator, in every group of
// this process (a process drives one GPU). NCCL's thread-safety rules forbid issuing operations to
// independent communicators of one device from several threads at once, and the direct pipeline
// route does exactly that: the p2p stream's host worker receives while the issuing thread sends
// and reduces (runtime/graph/executor.h). The calls it guards return at once on nonblocking
// communicators (ncclInProgress while NCCL connects in the background), so the lock is never held
// while waiting for a peer: the polls that wait run outside it, and no rank's lock can be part of
// a wait across ranks.
std::mutex& nccl_call_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

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
  retired_listener_ = add_stream_retired_listener([this](const StreamKey& stream) {
    if (stream.device == device_) retire_stream(stream);
  });
  watchdog_ = std::make_unique<CollectiveWatchdog>(
      comm_timeout_seconds() * 1000.0, /*poll_interval_ms=*/100.0, [this] { return check_communicators(); },
      [this](const std::string& failure) { abort_job(failure); },
      // The thread queries this group's events and frees its tensors: on its GPU, never GPU 0's
      // context by default (collective_watchdog.h).
      [device = device_] { cuda::set_device(device); });
}

NcclProcessGroup::~NcclProcessGroup() {
  // Outstanding collectives finish first (the watchdog still times out a stuck one), so that no
  // tensor a collective uses is released and no communicator is finalized under running work.
  for (;;) {
    const std::string failure = watchdog_->poll();
    if (!failure.empty()) abort_job(failure);
    if (watchdog_->tracked() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  watchdog_.reset();
  remove_stream_retired_listener(retired_listener_);
  std::vector<ncclComm_t> communicators;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [stream, comm] : comms_) communicators.push_back(comm);
    communicators.insert(communicators.end(), retired_comms_.begin(), retired_comms_.end());
    comms_.clear();
    retired_comms_.clear();
  }
  remove_abort_hook(abort_hook_);
  cudaSetDevice(device_);
  // Nonblocking communicators finalize in the background. All of them are started before any is
  // waited for: their order (by stream id) differs between ranks, and finalizing may wait for the
  // peers' finalize of the same communicator.
  const double timeout = comm_timeout_seconds();
  const auto deadline = deadline_after(timeout);
  std::vector<ncclResult_t> states;
  {
    std::lock_guard<std::mutex> call(nccl_call_mutex());
    for (ncclComm_t comm : communicators) states.push_back(ncclCommFinalize(comm));
  }
  for (bool pending = true; pending && std::chrono::steady_clock::now() < deadline;) {
    pending = false;
    for (size_t i = 0; i < communicators.size(); ++i) {
      if (states[i] != ncclInProgress) continue;
      if (ncclCommGetAsyncError(communicators[i], &states[i]) != ncclSuccess) states[i] = ncclInternalError;
      pending = pending || states[i] == ncclInProgress;
    }
    if (pending) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (size_t i = 0; i < communicators.size(); ++i) {
    if (states[i] == ncclSuccess) {
      ncclCommDestroy(communicators[i]);
      continue;
    }
    std::fprintf(stderr, "weft: process group %s: finalizing an NCCL communicator %s; aborting it\n",
                 describe().c_str(),
                 states[i] == ncclInProgress ? str("took over ", timeout, " s (WEFT_COMM_TIMEOUT_S)").c_str()
                                             : ncclGetErrorString(states[i]));
    ncclCommAbort(communicators[i]);
  }
  if (mpi_is_active()) {
    MpiCallLock lock;
    MPI_Comm_free(&mpi_comm_);
  }
}

size_t NcclProcessGroup::communicator_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return comms_.size();
}

size_t NcclProcessGroup::retired_communicator_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return retired_comms_.size();
}

NcclProcessGroup::ResolvedStream NcclProcessGroup::resolve(const CommStream& stream,
                                                           const std::string& description) const {
  WEFT_CHECK(!stream.is_cpu_thread(), description, ": the NCCL process group runs on CUDA streams, not on CPU comm "
             "stream '", stream.name(), "'; use CommStream::cuda or the caller stream");
  if (stream.is_cuda()) {
    WEFT_CHECK(stream.cuda_device() == device_, description, ": stream ", stream.name(),
               " is not on the group's device cuda:", device_);
    if (stream.cuda_stream()) return {stream.cuda_stream(), cuda::stream_id(stream.cuda_stream())};
  }
  return {cuda::current_stream(device_), cuda::current_stream_id(device_)};
}

ncclComm_t NcclProcessGroup::stream_comm(const ResolvedStream& stream, const std::string& description) {
  // Creation is collective over the group: two streams of this group first used from two threads
  // are created one after the other on this rank, so that each id broadcast meets its own on every
  // peer. Only this group's: a creation waits for its peers (the id's broadcast, the
  // initialisation), and a lock shared with other groups would make that wait hold up their
  // creations on this rank too, which a peer may be waiting for in turn (the direct pipeline
  // route's groups are created by two threads, parallel/pipeline/pipeline_transport.h).
  std::lock_guard<std::mutex> creation(creation_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = comms_.find(stream.id);
    if (found != comms_.end()) return found->second;
  }
  const std::string what =
      str("creating the NCCL communicator of ", describe(), " for cuda:", device_, " stream id ", stream.id,
          " (first used by ", description, ")");
  // The unique id travels over MPI from this thread.
  WEFT_CHECK(mpi_callable_from_this_thread(), what, ": MPI granted thread level ",
             MpiEnvironment::current() ? MpiEnvironment::current()->thread_level() : -1,
             ", below MPI_THREAD_SERIALIZED, so the communicator's unique id cannot go over MPI from a thread other "
             "than main; make each stream's first collective from the main thread, or use an MPI built with thread "
             "support");
  ncclComm_t comm = create_communicator(what);
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.emplace(stream.id, comm);
  return comm;
}

ncclComm_t NcclProcessGroup::create_communicator(const std::string& what) {
  const double timeout = comm_timeout_seconds();
  const auto deadline = deadline_after(timeout);
  ncclUniqueId id{};
  if (rank_ == 0) {
    std::lock_guard<std::mutex> call(nccl_call_mutex());
    WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
  }
  broadcast_before_deadline(mpi_comm_, &id, static_cast<int>(sizeof(id)), deadline, timeout, what, world_ranks_);
  cuda::set_device(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once, so that the initialisation can be given a deadline
  ncclComm_t comm = nullptr;
  ncclResult_t started = ncclSuccess;
  {
    std::lock_guard<std::mutex> call(nccl_call_mutex());
    started = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  }
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    WEFT_FAIL(what, ": ncclCommInitRankConfig failed: ", ncclGetErrorString(started), " (", ncclGetLastError(nullptr),
              ")");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    initializing_ = comm;
  }
  try {
    wait_until_ready(comm, what, deadline, timeout);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      initializing_ = nullptr;
    }
    ncclCommAbort(comm);
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  initializing_ = nullptr;
  return comm;
}

void NcclProcessGroup::wait_until_ready(ncclComm_t comm, const std::string& what,
                                        std::chrono::steady_clock::time_point deadline, double timeout_seconds) {
  auto pause = std::chrono::microseconds(5);
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    WEFT_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      WEFT_FAIL(what, ": NCCL failed: ", ncclGetErrorString(state), " (", ncclGetLastError(comm), ")");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      abort_job(str(what, " did not complete within ", timeout_seconds, " s (WEFT_COMM_TIMEOUT_S)"));
    }
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

CollectiveHandlePtr NcclProcessGroup::launch(const CommStream& stream, const std::string& description, int64_t bytes,
                                             std::vector<Tensor> keep_alive,
                                             const std::function<void(ncclComm_t, cudaStream_t)>& body) {
  const ResolvedStream resolved = resolve(stream, description);
  ncclComm_t comm = stream_comm(resolved, description);
  cuda::set_device(device_);
  auto handle = std::make_shared<CudaCollectiveHandle>(description, bytes, device_, resolved.stream,
                                                       std::move(keep_alive));
  {
    std::lock_guard<std::mutex> call(nccl_call_mutex());
    body(comm, resolved.stream);
  }
  // On a nonblocking communicator the call may return before its kernel is on the stream; the end
  // event must come after it.
  const double timeout = comm_timeout_seconds();
  wait_until_ready(comm, description, deadline_after(timeout), timeout);
  handle->record_end();
  watchdog_->track(handle);
  return handle;
}

std::string NcclProcessGroup::check_communicators() {
  std::vector<ncclComm_t> communicators;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [stream, comm] : comms_) communicators.push_back(comm);
  }
  for (ncclComm_t comm : communicators) {
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async_error) != ncclSuccess) continue;
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
      return str("NCCL reported an asynchronous error on ", describe(), ": ", ncclGetErrorString(async_error), " (",
                 ncclGetLastError(comm), ")");
    }
  }
  return "";
}

void NcclProcessGroup::abort_job(const std::string& failure) {
  const std::string gone = describe_failed_peers(world_ranks_);
  // abort_all runs the abort hooks, ours included (ncclCommAbort), before MPI_Abort.
  abort_all(str(failure, "; ",
                gone.empty() ? "a peer rank failed or is stuck (no rank of the group on this host has exited)" : gone));
}

void NcclProcessGroup::abort_communicators() {
  std::vector<ncclComm_t> communicators;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [stream, comm] : comms_) communicators.push_back(comm);
    communicators.insert(communicators.end(), retired_comms_.begin(), retired_comms_.end());
    if (initializing_ != nullptr) communicators.push_back(initializing_);
  }
  for (ncclComm_t comm : communicators) ncclCommAbort(comm);
}

void NcclProcessGroup::retire_stream(const StreamKey& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = comms_.find(stream.id);
  if (found == comms_.end()) return;
  retired_comms_.push_back(found->second);
  comms_.erase(found);
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
                  if (result == ncclSuccess || result == ncclInProgress) {
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
