#include "parallel/comm/mpi_process_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "parallel/comm/collective_arguments.h"
#include "parallel/comm/comm_thread.h"
#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace weft {
namespace {

bool is_16_bit_float(DType dtype) { return dtype == kBFloat16 || dtype == kFloat16; }

// The MPI type elements travel as (16-bit floats as words: moved, never reduced, in that form).
MPI_Datatype transfer_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kBFloat16:
    case DType::kFloat16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

// The MPI type a reduction runs in (16-bit floats reduce as f32).
MPI_Datatype reduction_type(DType dtype) { return is_16_bit_float(dtype) ? MPI_FLOAT : transfer_type(dtype); }

MPI_Op mpi_op(Reduction reduction) { return reduction == Reduction::kMax ? MPI_MAX : MPI_SUM; }

int mpi_count(int64_t count, const std::string& description) {
  WEFT_CHECK(count <= INT_MAX, description, ": ", count, " elements exceed MPI's count limit (", INT_MAX,
             "); split the tensor");
  return static_cast<int>(count);
}

void to_f32(const Tensor& tensor, std::vector<float>& out) {
  const int64_t n = tensor.numel();
  out.resize(static_cast<size_t>(n));
  if (tensor.dtype() == kBFloat16) {
    const BFloat16* in = tensor.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  } else {
    const Float16* in = tensor.data<Float16>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  }
}

void from_f32(const std::vector<float>& values, const Tensor& tensor) {
  const int64_t n = tensor.numel();
  if (tensor.dtype() == kBFloat16) {
    BFloat16* out = tensor.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) out[i] = BFloat16(values[i]);
  } else {
    Float16* out = tensor.data<Float16>();
    for (int64_t i = 0; i < n; ++i) out[i] = Float16(values[i]);
  }
}

// Divides `count` elements at `data` (of `dtype`, never an integer) by `divisor`.
void divide(void* data, DType dtype, int64_t count, int divisor) {
  if (divisor == 1) return;
  if (dtype == kFloat64) {
    double* values = static_cast<double*>(data);
    for (int64_t i = 0; i < count; ++i) values[i] /= divisor;
  } else {
    float* values = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) values[i] /= static_cast<float>(divisor);
  }
}

// WEFT_MPI_POLL_PAUSE_US, or -1 where it is not set.
int64_t poll_pause_from_environment() {
  const char* value = std::getenv("WEFT_MPI_POLL_PAUSE_US");
  if (value == nullptr || *value == '\0') return -1;
  int64_t microseconds = 0;
  WEFT_CHECK(absl::SimpleAtoi(value, &microseconds) && microseconds >= 0, "WEFT_MPI_POLL_PAUSE_US='", value,
             "' is not a whole number of microseconds (0 or more; 0: poll without sleeping)");
  return microseconds;
}

std::atomic<int64_t>& poll_pause_limit() {
  static std::atomic<int64_t> limit{[] {
    const int64_t configured = poll_pause_from_environment();
    return configured >= 0 ? configured : kCpuMpiPollPauseUs;
  }()};
  return limit;
}

}  // namespace

int64_t mpi_poll_pause_limit_us() { return poll_pause_limit().load(std::memory_order_relaxed); }

void set_mpi_poll_pause_limit_us(int64_t microseconds) {
  if (poll_pause_from_environment() >= 0) return;
  poll_pause_limit().store(std::max<int64_t>(microseconds, 0), std::memory_order_relaxed);
}

void wait_for_mpi_request(MPI_Request& request, const std::string& description, const std::vector<int>& world_ranks,
                          MPI_Status* status) {
  wait_for_mpi_request_pausing(request, description, world_ranks, mpi_poll_pause_limit_us(), status);
}

void wait_for_mpi_request_pausing(MPI_Request& request, const std::string& description,
                                  const std::vector<int>& world_ranks, int64_t pause_limit_us, MPI_Status* status) {
  using Clock = std::chrono::steady_clock;
  const double timeout = comm_timeout_seconds();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
  // Poll quickly at first (most operations finish within microseconds), then back off to the limit
  // (200 us on CPU ranks, unless the poll probe chose 0) so that a waiting comm thread leaves the
  // cores to compute. Each MPI_Test also drives MPI's progress, so where the limit is 0 it never
  // sleeps (mpi_process_group.h).
  const auto limit = std::chrono::microseconds(std::max<int64_t>(pause_limit_us, 0));
  auto pause = std::min(std::chrono::microseconds(5), limit);
  for (int polls = 0;; ++polls) {
    int done = 0;
    {
      MpiCallLock lock;
      WEFT_MPI_CHECK(MPI_Test(&request, &done, status));
    }
    if (done) return;
    if (Clock::now() > deadline) {
      const std::string gone = describe_failed_peers(world_ranks);
      abort_all(str(description, " did not complete within ", timeout, " s (WEFT_COMM_TIMEOUT_S); ",
                    gone.empty() ? "a peer rank failed or is stuck (no rank of the group on this host has exited)"
                                 : gone));
    }
    if (polls < 64 || limit.count() == 0) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, limit);
    }
  }
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name, std::vector<int> world_ranks)
    : comm_(comm), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {
  MpiCallLock lock;
  WEFT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  WEFT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  WEFT_CHECK(static_cast<int>(world_ranks_.size()) == size_, "process group '", name_, "': ", world_ranks_.size(),
             " world ranks named for a communicator of ", size_);
}

MpiProcessGroup::~MpiProcessGroup() {
  if (!mpi_is_active()) return;
  MpiCallLock lock;
  for (auto& [id, stream] : stream_comms_) {
    if (stream->pending != MPI_REQUEST_NULL) MPI_Wait(&stream->pending, MPI_STATUS_IGNORE);
    MPI_Comm_free(&stream->comm);
  }
  MPI_Comm_free(&comm_);
}

std::shared_ptr<MpiProcessGroup::StreamComm> MpiProcessGroup::stream_comm(const CommStream& stream) {
  // Below MPI_THREAD_SERIALIZED only the main thread may call MPI: a comm thread's stream, or any
  // stream used from another thread (an executor's dp_comm thread runs a named caller stream).
  if (MpiEnvironment::current() != nullptr && MpiEnvironment::current()->thread_level() < MPI_THREAD_SERIALIZED) {
    WEFT_CHECK(!stream.is_cpu_thread() && mpi_callable_from_this_thread(), "process group ", describe(),
               ": MPI granted thread level ",
               MpiEnvironment::current()->thread_level(), ", below MPI_THREAD_SERIALIZED, so collectives cannot run ",
               stream.is_cpu_thread() ? "on comm stream '" + stream.name() + "'" : "from a thread other than main",
               " (comm.mode: auto runs them on communication threads); use comm.mode: manual or an MPI built "
               "with thread support");
  }
  std::lock_guard<std::mutex> guard(comms_mutex_);
  auto found = stream_comms_.find(stream.id());
  if (found != stream_comms_.end()) return found->second;
  auto created = std::make_shared<StreamComm>();
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_idup(comm_, &created->comm, &created->pending));
  }
  stream_comms_.emplace(stream.id(), created);
  return created;
}

CollectiveHandlePtr MpiProcessGroup::run(const CommStream& stream, std::string description, int64_t bytes,
                                         std::function<void(MPI_Comm, const std::string&)> body) {
  WEFT_CHECK(!stream.is_cuda(), description, ": the MPI (CPU) process group cannot run on CUDA stream ",
             stream.name());
  std::shared_ptr<StreamComm> comm = stream_comm(stream);
  if (stream.id() != 0) description += str(" on stream '", stream.name(), "'");
  // The task holds the group, so a group dropped while work is queued lives until that work is done.
  auto self = shared_from_this();
  return run_on_host_stream(stream, description, bytes, [self, comm, description, body = std::move(body)] {
    // Only this stream's operations touch its communicator, one at a time: no lock is needed.
    if (comm->pending != MPI_REQUEST_NULL) {
      wait_for_mpi_request(comm->pending, str(description, " (creating the stream's communicator)"),
                           self->world_ranks_);
      MpiCallLock lock;
      WEFT_MPI_CHECK(MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN));
    }
    body(comm->comm, description);
  });
}

// The most bytes one MPI call reduces: all-reduce (see all_reduce) and reduce-scatter (all ranks'
// blocks together, see reduce_scatter) cut larger tensors into calls of at most this.
constexpr int64_t kAllReduceCallBytes = int64_t{4} << 20;
constexpr int64_t kReduceScatterCallBytes = int64_t{8} << 20;

CollectiveHandlePtr MpiProcessGroup::all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) {
  check_all_reduce(*this, tensor, reduction);
  const std::string operation = str("all_reduce(", reduction_name(reduction), ")");
  const int count = mpi_count(tensor.numel(), operation);
  const int size = size_;
  const std::vector<int>& ranks = world_ranks_;
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
             [tensor, reduction, count, size, ranks](MPI_Comm comm, const std::string& description) {
               std::vector<float> widened;
               void* data = tensor.raw_data();
               if (is_16_bit_float(tensor.dtype())) {
                 to_f32(tensor, widened);
                 data = widened.data();
               }
               // Open MPI's all-reduce slows about twelvefold on one host once a call reaches 32 MB, and
               // calls of 4 MB are at least as fast as one large call below that (docs/performance.md,
               // "all-reduce in pieces"): a larger tensor is reduced slice by slice, each element once,
               // over the same ranks, by the same operation.
               const int64_t element = is_16_bit_float(tensor.dtype()) ? 4 : tensor.element_size();
               const int64_t piece = std::max<int64_t>(1, kAllReduceCallBytes / element);
               for (int64_t start = 0; start < count; start += piece) {
                 const int64_t length = std::min<int64_t>(piece, count - start);
                 MPI_Request request;
                 {
                   MpiCallLock lock;
                   WEFT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + start * element,
                                                 static_cast<int>(length), reduction_type(tensor.dtype()),
                                                 mpi_op(reduction), comm, &request));
                 }
                 wait_for_mpi_request(request, description, ranks);
               }
               if (reduction == Reduction::kAverage) {
                 divide(data, is_16_bit_float(tensor.dtype()) ? kFloat32 : tensor.dtype(), count, size);
               }
               if (!widened.empty()) from_f32(widened, tensor);
             });
}

CollectiveHandlePtr MpiProcessGroup::reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                                    const CommStream& stream) {
  const int64_t n = check_reduce_scatter(*this, input, output, reduction);
  const std::string operation = str("reduce_scatter(", reduction_name(reduction), ")");
  const int count = mpi_count(n, operation);
  mpi_count(input.numel(), operation);
  const int size = size_;
  const std::vector<int>& ranks = world_ranks_;
  return run(stream, describe_collective(*this, operation, input), input.numel() * input.element_size(),
             [input, output, reduction, count, size, ranks](MPI_Comm comm, const std::string& description) {
               std::vector<float> wide_input;
               std::vector<float> wide_output;
               const void* send = input.raw_data();
               void* receive = output.raw_data();
               if (is_16_bit_float(input.dtype())) {
                 to_f32(input, wide_input);
                 wide_output.resize(static_cast<size_t>(count));
                 send = wide_input.data();
                 receive = wide_output.data();
               }
               // Open MPI's reduce-scatter (every variant, blocking too) slows about twentyfold on one
               // host once a call's input reaches 16 MB (docs/performance.md, "reduce-scatter in
               // pieces"), while calls of 8 MB keep all-reduce's pace: a larger input is reduced piece
               // by piece, each piece packed from every rank's block. Each element is still reduced
               // once, over the same ranks, by the same operation.
               const int64_t element = is_16_bit_float(input.dtype()) ? 4 : input.element_size();
               const int64_t piece = std::max<int64_t>(1, kReduceScatterCallBytes / (size * element));
               std::vector<char> packed;
               for (int64_t start = 0; start < count; start += piece) {
                 const int64_t length = std::min<int64_t>(piece, count - start);
                 const void* piece_send = send;
                 if (length < count) {
                   packed.resize(static_cast<size_t>(size * length * element));
                   for (int r = 0; r < size; ++r) {
                     std::memcpy(packed.data() + r * length * element,
                                 static_cast<const char*>(send) + (r * static_cast<int64_t>(count) + start) * element,
                                 static_cast<size_t>(length * element));
                   }
                   piece_send = packed.data();
                 }
                 MPI_Request request;
                 {
                   MpiCallLock lock;
                   WEFT_MPI_CHECK(MPI_Ireduce_scatter_block(piece_send, static_cast<char*>(receive) + start * element,
                                                            static_cast<int>(length), reduction_type(input.dtype()),
                                                            mpi_op(reduction), comm, &request));
                 }
                 wait_for_mpi_request(request, description, ranks);
               }
               if (reduction == Reduction::kAverage) {
                 divide(receive, is_16_bit_float(input.dtype()) ? kFloat32 : input.dtype(), count, size);
               }
               if (!wide_output.empty()) from_f32(wide_output, output);
             });
}

CollectiveHandlePtr MpiProcessGroup::all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) {
  const int64_t n = check_all_gather(*this, input, output);
  const int count = mpi_count(n, "all_gather");
  mpi_count(output.numel(), "all_gather");
  const std::vector<int>& ranks = world_ranks_;
  return run(stream, describe_collective(*this, "all_gather", input), input.numel() * input.element_size(),
             [input, output, count, ranks](MPI_Comm comm, const std::string& description) {
               const MPI_Datatype type = transfer_type(input.dtype());
               MPI_Request request;
               {
                 MpiCallLock lock;
                 WEFT_MPI_CHECK(MPI_Iallgather(input.raw_data(), count, type, output.raw_data(), count, type, comm,
                                               &request));
               }
               wait_for_mpi_request(request, description, ranks);
             });
}

CollectiveHandlePtr MpiProcessGroup::broadcast(const Tensor& tensor, int root, const CommStream& stream) {
  const std::string operation = check_broadcast(*this, tensor, root);
  const int count = mpi_count(tensor.numel(), operation);
  const std::vector<int>& ranks = world_ranks_;
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
             [tensor, root, count, ranks](MPI_Comm comm, const std::string& description) {
               MPI_Request request;
               {
                 MpiCallLock lock;
                 WEFT_MPI_CHECK(MPI_Ibcast(tensor.raw_data(), count, transfer_type(tensor.dtype()), root, comm,
                                           &request));
               }
               wait_for_mpi_request(request, description, ranks);
             });
}

CollectiveHandlePtr MpiProcessGroup::send(const Tensor& tensor, int peer, const CommStream& stream) {
  const std::string operation = check_send(*this, tensor, peer);
  const int count = mpi_count(tensor.numel(), operation);
  const std::vector<int> ranks = {world_ranks_[static_cast<size_t>(peer)]};
  // WEFT_MPI_SYNCHRONOUS_SENDS=1: every send waits until its receive has started, as NCCL's does,
  // whatever its size. Without it a message under MPI's eager limit (4 KB in Open MPI's shared
  // memory) leaves at once, so a test's small model would not show whether a plan holds under
  // NCCL's rendezvous (tests/distributed/pipeline_equivalence.sh sets it for the direct route).
  static const bool synchronous = [] {
    const char* value = std::getenv("WEFT_MPI_SYNCHRONOUS_SENDS");
    return value != nullptr && std::string(value) == "1";
  }();
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
             [tensor, peer, count, ranks](MPI_Comm comm, const std::string& description) {
               MPI_Request request;
               {
                 MpiCallLock lock;
                 WEFT_MPI_CHECK((synchronous ? MPI_Issend : MPI_Isend)(tensor.raw_data(), count,
                                                                       transfer_type(tensor.dtype()), peer, 0, comm,
                                                                       &request));
               }
               wait_for_mpi_request(request, description, ranks);
             });
}

CollectiveHandlePtr MpiProcessGroup::recv(const Tensor& tensor, int peer, const CommStream& stream) {
  const std::string operation = check_recv(*this, tensor, peer);
  const int count = mpi_count(tensor.numel(), operation);
  const std::vector<int> ranks = {world_ranks_[static_cast<size_t>(peer)]};
  return run(stream, describe_collective(*this, operation, tensor), tensor.numel() * tensor.element_size(),
             [tensor, peer, count, ranks](MPI_Comm comm, const std::string& description) {
               const MPI_Datatype type = transfer_type(tensor.dtype());
               MPI_Request request;
               {
                 MpiCallLock lock;
                 WEFT_MPI_CHECK(MPI_Irecv(tensor.raw_data(), count, type, peer, 0, comm, &request));
               }
               MPI_Status status;
               wait_for_mpi_request(request, description, ranks, &status);
               int received = 0;
               MPI_Get_count(&status, type, &received);
               WEFT_CHECK(received == count, description, ": received ", received, " elements, expected ", count,
                          " (the sender's tensor differs in size or dtype)");
             });
}

CollectiveHandlePtr MpiProcessGroup::exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor,
                                              int recv_peer, const CommStream& stream) {
  const std::string operation = check_exchange(*this, send_tensor, send_peer, recv_tensor, recv_peer);
  const int send_count = mpi_count(send_tensor.numel(), operation);
  const int recv_count = mpi_count(recv_tensor.numel(), operation);
  const std::vector<int> ranks = {world_ranks_[static_cast<size_t>(send_peer)],
                                  world_ranks_[static_cast<size_t>(recv_peer)]};
  return run(stream, describe_collective(*this, operation, send_tensor),
             send_tensor.numel() * send_tensor.element_size(),
             [send_tensor, send_peer, recv_tensor, recv_peer, send_count, recv_count, ranks](
                 MPI_Comm comm, const std::string& description) {
               const MPI_Datatype recv_type = transfer_type(recv_tensor.dtype());
               MPI_Request requests[2];
               {
                 MpiCallLock lock;
                 WEFT_MPI_CHECK(MPI_Irecv(recv_tensor.raw_data(), recv_count, recv_type, recv_peer, 0, comm,
                                          &requests[0]));
                 WEFT_MPI_CHECK(MPI_Isend(send_tensor.raw_data(), send_count, transfer_type(send_tensor.dtype()),
                                          send_peer, 0, comm, &requests[1]));
               }
               MPI_Status status;
               wait_for_mpi_request(requests[0], description, ranks, &status);
               wait_for_mpi_request(requests[1], description, ranks);
               int received = 0;
               MPI_Get_count(&status, recv_type, &received);
               WEFT_CHECK(received == recv_count, description, ": received ", received, " elements, expected ",
                          recv_count, " (the sender's tensor differs in size or dtype)");
             });
}

CollectiveHandlePtr MpiProcessGroup::barrier(const CommStream& stream) {
  const std::vector<int>& ranks = world_ranks_;
  return run(stream, describe_collective(*this, "barrier", Tensor()), 0,
             [ranks](MPI_Comm comm, const std::string& description) {
               MPI_Request request;
               {
                 MpiCallLock lock;
                 WEFT_MPI_CHECK(MPI_Ibarrier(comm, &request));
               }
               wait_for_mpi_request(request, description, ranks);
             });
}

}  // namespace weft
