// PipelineTransport (pipeline_transport.h).
#include "parallel/pipeline/pipeline_transport.h"

#include <algorithm>
#include <array>
#include <climits>

#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/error.h"

namespace weft {
namespace {

MPI_Comm as_comm(void* comm) { return static_cast<MPI_Comm>(comm); }

// A message's header: the dtype, the number of dimensions, then each size.
constexpr int kMaxDimensions = 8;
constexpr int kHeaderWords = 2 + kMaxDimensions;

const DType kHeaderDtypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64};

int byte_count(const Tensor& tensor, const char* what) {
  const int64_t bytes = tensor.numel() * tensor.element_size();
  WEFT_CHECK(bytes <= INT_MAX, "pipeline ", what, ": ", tensor.describe(), " is more than 2 GiB in one message; "
             "use more micro-batches (train.micro_batches) so that each activation is smaller");
  return static_cast<int>(bytes);
}

}  // namespace

// A send in flight: the host tensor MPI reads from, kept until the request completes.
struct PipelineTransport::PendingSend {
  std::array<int64_t, kHeaderWords> header{};
  Tensor host;
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // header, data
  std::string description;
  int peer_world_rank = -1;
};

PipelineTransport::PipelineTransport(const Mesh& mesh, int world_rank) {
  stages_ = mesh.pp();
  stage_ = mesh.coordinates(world_rank).pp;
  world_ranks_ = mesh.group_ranks(Axis::kPipeline, world_rank);
  if (stages_ == 1) return;
  WEFT_CHECK(mpi_is_active(), "pipeline parallelism over ", stages_, " stages needs MPI: start the program with "
             "mpirun -np ", mesh.world_size());
  MPI_Comm step = MPI_COMM_NULL, control = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mesh.group_index(Axis::kPipeline, world_rank), stage_, &step));
    WEFT_MPI_CHECK(MPI_Comm_set_errhandler(step, MPI_ERRORS_RETURN));
    WEFT_MPI_CHECK(MPI_Comm_dup(step, &control));
    void* bound = nullptr;
    int found = 0;
    WEFT_MPI_CHECK(MPI_Comm_get_attr(step, MPI_TAG_UB, &bound, &found));
    if (found && bound != nullptr) max_tag_ = *static_cast<int*>(bound) / 2;
  }
  step_comm_ = step;
  control_comm_ = control;
}

PipelineTransport::~PipelineTransport() {
  if (step_comm_ == nullptr || !mpi_is_active()) return;
  // Sends still in flight (a step that threw) are left to MPI_Finalize: waiting here could hang on
  // a peer that is gone.
  MpiCallLock lock;
  MPI_Comm step = as_comm(step_comm_), control = as_comm(control_comm_);
  MPI_Comm_free(&step);
  MPI_Comm_free(&control);
}

void* PipelineTransport::communicator(Channel channel) const {
  WEFT_CHECK(step_comm_ != nullptr, "pipeline transport: one stage has no peers to send to");
  return channel == Channel::kStep ? step_comm_ : control_comm_;
}

void PipelineTransport::post_send(const Tensor& tensor, int peer, int64_t tag, Channel channel) {
  WEFT_CHECK(peer >= 0 && peer < stages_ && peer != stage_, "pipeline send from stage ", stage_, " to stage ", peer,
             ": not another stage of ", stages_);
  WEFT_CHECK(tag >= 0 && tag <= max_tag(), "pipeline send: tag ", tag, " is above MPI's limit ", max_tag_,
             "; use fewer micro-batches or pipeline stages");
  auto pending = std::make_unique<PendingSend>();
  // Kept alive until sent. On the CPU it is the tensor itself (when contiguous): the step's
  // activations and gradients are never written after they are sent, and a caller that will write
  // its tensor sends a clone.
  pending->host = tensor.device().is_cpu() ? tensor.contiguous() : tensor.to(Device::cpu());
  WEFT_CHECK(pending->host.dim() <= kMaxDimensions, "pipeline send: ", tensor.describe(), " has more than ",
             kMaxDimensions, " dimensions");
  const auto dtype = std::find(std::begin(kHeaderDtypes), std::end(kHeaderDtypes), tensor.dtype());
  pending->header[0] = dtype - std::begin(kHeaderDtypes);
  pending->header[1] = pending->host.dim();
  for (int64_t d = 0; d < pending->host.dim(); ++d) pending->header[2 + d] = pending->host.size(d);
  pending->description = str("pipeline send of ", tensor.describe(), " from stage ", stage_, " to stage ", peer,
                             " (tag ", tag, ")");
  pending->peer_world_rank = world_ranks_[static_cast<size_t>(peer)];
  const int bytes = byte_count(pending->host, "send");
  {
    MpiCallLock lock;
    MPI_Comm comm = as_comm(communicator(channel));
    WEFT_MPI_CHECK(MPI_Isend(pending->header.data(), kHeaderWords, MPI_INT64_T, peer, static_cast<int>(2 * tag),
                             comm, &pending->requests[0]));
    WEFT_MPI_CHECK(MPI_Isend(pending->host.raw_data(), bytes, MPI_BYTE, peer, static_cast<int>(2 * tag + 1), comm,
                             &pending->requests[1]));
  }
  std::lock_guard<std::mutex> guard(mutex_);
  pending_.push_back(std::move(pending));
}

Tensor PipelineTransport::receive(Device device, int peer, int64_t tag, Channel channel) {
  WEFT_CHECK(peer >= 0 && peer < stages_ && peer != stage_, "pipeline receive at stage ", stage_, " from stage ",
             peer, ": not another stage of ", stages_);
  const std::string description = str("pipeline receive at stage ", stage_, " from stage ", peer, " (tag ", tag, ")");
  const std::vector<int> peer_rank = {world_ranks_[static_cast<size_t>(peer)]};
  MPI_Comm comm = as_comm(communicator(channel));
  std::array<int64_t, kHeaderWords> header{};
  MPI_Request request = MPI_REQUEST_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Irecv(header.data(), kHeaderWords, MPI_INT64_T, peer, static_cast<int>(2 * tag), comm,
                             &request));
  }
  wait_for_mpi_request(request, description, peer_rank);
  WEFT_CHECK(header[0] >= 0 && header[0] < static_cast<int64_t>(std::size(kHeaderDtypes)) && header[1] >= 0 &&
                 header[1] <= kMaxDimensions,
             description, ": the message's header is not a tensor's (a peer of another weft version?)");
  Shape shape;
  for (int64_t d = 0; d < header[1]; ++d) shape.push_back(header[2 + d]);
  Tensor host = Tensor::empty(shape, kHeaderDtypes[header[0]], Device::cpu());
  const int bytes = byte_count(host, "receive");
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Irecv(host.raw_data(), bytes, MPI_BYTE, peer, static_cast<int>(2 * tag + 1), comm, &request));
  }
  MPI_Status status;
  wait_for_mpi_request(request, description, peer_rank, &status);
  int received = 0;
  MPI_Get_count(&status, MPI_BYTE, &received);
  WEFT_CHECK(received == bytes, description, ": received ", received, " bytes for ", host.describe(), ", expected ",
             bytes);
  return device.is_cpu() ? host : host.to(device);
}

void PipelineTransport::finish_sends() {
  std::vector<std::unique_ptr<PendingSend>> sends;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    sends.swap(pending_);
  }
  for (const std::unique_ptr<PendingSend>& send : sends) {
    for (MPI_Request& request : send->requests) wait_for_mpi_request(request, send->description, {send->peer_world_rank});
  }
}

}  // namespace weft
