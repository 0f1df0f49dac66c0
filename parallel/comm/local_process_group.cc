#include "parallel/comm/local_process_group.h"

#include <algorithm>
#include <iterator>

#include "parallel/comm/collective_arguments.h"
#include "parallel/comm/comm_thread.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

#if WEFT_HAVE_CUDA
#include "parallel/comm/cuda_collective_handle.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {

LocalProcessGroup::LocalProcessGroup(Device device, std::string name)
    : device_(device), name_(std::move(name)), world_ranks_{mpi_world_rank()} {}

LocalProcessGroup::~LocalProcessGroup() {
  std::vector<CollectiveHandlePtr> in_flight;
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    in_flight.swap(in_flight_);
  }
  for (const CollectiveHandlePtr& handle : in_flight) {
    try {
      handle->synchronize();
    } catch (...) {
      // A failed copy was reported to whoever waited on it; a destructor must not throw.
    }
  }
}

size_t LocalProcessGroup::in_flight_count() {
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  return in_flight_.size();
}

void LocalProcessGroup::hold_until_done(CollectiveHandlePtr handle) {
  std::vector<CollectiveHandlePtr> done;  // released after the lock is dropped: freeing takes the allocator's
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  auto kept = std::partition(in_flight_.begin(), in_flight_.end(), [](const CollectiveHandlePtr& held) {
    try {
      return !held->is_done();
    } catch (...) {
      return false;  // failed: its work is over, and the failure is its waiter's to see
    }
  });
  std::move(kept, in_flight_.end(), std::back_inserter(done));
  in_flight_.erase(kept, in_flight_.end());
  in_flight_.push_back(std::move(handle));
}

CollectiveHandlePtr LocalProcessGroup::run(const CommStream& stream, const std::string& description, int64_t bytes,
                                           const Tensor& source, const Tensor& destination) {
  const bool copy = source.defined() && !source.is_same(destination);
  if (device_.is_cpu()) {
    return run_on_host_stream(stream, description, bytes, [source, destination, copy] {
      if (copy) destination.view({-1}).copy_(source.view({-1}));
    });
  }
#if WEFT_HAVE_CUDA
  WEFT_CHECK(!stream.is_cpu_thread(), description, ": a CUDA group cannot run on CPU comm stream '", stream.name(),
             "'; use CommStream::cuda or the caller stream");
  cuda::set_device(device_.index);
  cudaStream_t cuda_stream =
      stream.is_cuda() && stream.cuda_stream() ? stream.cuda_stream() : cuda::current_stream(device_.index);
  auto handle = std::make_shared<CudaCollectiveHandle>(description, bytes, device_.index, cuda_stream,
                                                       std::vector<Tensor>{source, destination});
  if (copy) {
    cuda::StreamGuard guard(device_.index, cuda_stream);
    destination.view({-1}).copy_(source.view({-1}));
  }
  handle->record_end();
  hold_until_done(handle);
  return handle;
#else
  WEFT_FAIL(description, ": this build of weft has no CUDA");
#endif
}

CollectiveHandlePtr LocalProcessGroup::all_reduce(const Tensor& tensor, Reduction reduction,
                                                  const CommStream& stream) {
  check_all_reduce(*this, tensor, reduction);
  const std::string operation = str("all_reduce(", reduction_name(reduction), ")");
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(), Tensor(),
             tensor);
}

CollectiveHandlePtr LocalProcessGroup::reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                                      const CommStream& stream) {
  check_reduce_scatter(*this, input, output, reduction);
  const std::string operation = str("reduce_scatter(", reduction_name(reduction), ")");
  return run(stream, describe_collective(*this, operation, input), input.numel() * input.element_size(), input,
             output);
}

CollectiveHandlePtr LocalProcessGroup::all_gather(const Tensor& input, const Tensor& output,
                                                  const CommStream& stream) {
  check_all_gather(*this, input, output);
  return run(stream, describe_collective(*this, "all_gather", input), input.numel() * input.element_size(), input,
             output);
}

CollectiveHandlePtr LocalProcessGroup::broadcast(const Tensor& tensor, int root, const CommStream& stream) {
  const std::string operation = check_broadcast(*this, tensor, root);
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(), Tensor(),
             tensor);
}

CollectiveHandlePtr LocalProcessGroup::send(const Tensor& tensor, int peer, const CommStream& stream) {
  const std::string operation = check_send(*this, tensor, peer);
  // On the CPU the copy is taken now, so the sender may reuse its tensor at once (as after an eager
  // MPI send); on CUDA it is queued on the stream like any collective.
  const std::string description = describe_collective(*this, operation, tensor);
  const int64_t bytes = tensor.numel() * tensor.element_size();
  Tensor copy;
  CollectiveHandlePtr handle;
  if (device_.is_cpu()) {
    copy = tensor.clone();
    handle = run(stream, description, bytes, Tensor(), copy);
  } else {
    copy = Tensor::empty(tensor.shape(), tensor.dtype(), device_);
    handle = run(stream, description, bytes, tensor, copy);
  }
  std::lock_guard<std::mutex> lock(sends_mutex_);
  sends_.push_back(copy);
  return handle;
}

CollectiveHandlePtr LocalProcessGroup::recv(const Tensor& tensor, int peer, const CommStream& stream) {
  const std::string operation = check_recv(*this, tensor, peer);
  Tensor sent;
  {
    std::lock_guard<std::mutex> lock(sends_mutex_);
    WEFT_CHECK(!sends_.empty(), operation, " on ", describe(),
               ": nothing was sent to this rank; in a group of one, send before recv");
    sent = sends_.front();
    sends_.pop_front();
  }
  WEFT_CHECK(sent.numel() == tensor.numel() && sent.dtype() == tensor.dtype(), operation, " on ", describe(),
             ": received ", sent.describe(), " into ", tensor.describe(), ", which differs in size or dtype");
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(), sent,
             tensor);
}

CollectiveHandlePtr LocalProcessGroup::exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor,
                                                int recv_peer, const CommStream& stream) {
  const std::string operation = check_exchange(*this, send_tensor, send_peer, recv_tensor, recv_peer);
  WEFT_CHECK(send_tensor.numel() == recv_tensor.numel() && send_tensor.dtype() == recv_tensor.dtype(), operation,
             " on ", describe(), ": sent ", send_tensor.describe(), " into ", recv_tensor.describe(),
             ", which differs in size or dtype");
  return run(stream, describe_collective(*this, operation, send_tensor),
             send_tensor.numel() * send_tensor.element_size(), send_tensor, recv_tensor);
}

CollectiveHandlePtr LocalProcessGroup::barrier(const CommStream& stream) {
  return run(stream, describe_collective(*this, "barrier", Tensor()), 0, Tensor(), Tensor());
}

std::shared_ptr<ProcessGroup> make_local_process_group(Device device, const std::string& name) {
  return std::make_shared<LocalProcessGroup>(device, name);
}

}  // namespace weft
