// PipelineTransport (pipeline_transport.h).
#include "parallel/pipeline/pipeline_transport.h"

#include <algorithm>
#include <array>
#include <climits>

#include "parallel/comm/host_staged_process_group.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/error.h"

namespace weft {
namespace {

MPI_Comm as_comm(void* comm) { return static_cast<MPI_Comm>(comm); }

// A message's header: the dtype, the number of dimensions, each size, then (kDirect step
// messages) the message's place in its direction's order, -1 otherwise.
constexpr int kMaxDimensions = 8;
constexpr int kHeaderWords = 3 + kMaxDimensions;
constexpr int kSequenceWord = kHeaderWords - 1;

const DType kHeaderDtypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64};

int byte_count(const Tensor& tensor, const char* what) {
  const int64_t bytes = tensor.numel() * tensor.element_size();
  WEFT_CHECK(bytes <= INT_MAX, "pipeline ", what, ": ", tensor.describe(), " is more than 2 GiB in one message; "
             "use more micro-batches (train.micro_batches) so that each activation is smaller");
  return static_cast<int>(bytes);
}

// Where a direct send or receive runs: NCCL queues on the current stream of the tensor's GPU; the
// CPU's caller stream runs it on the calling thread.
CommStream direct_stream(Device device) {
  return device.is_cuda() ? CommStream::cuda(nullptr, device.index) : CommStream();
}

// The ordered stage pairs (sender, receiver) that get a direct group: both directions between ring
// neighbours (stage s and s + 1, and the last and the first, which the interleaved schedule's
// chunks pass between), each once, in one order on every rank.
std::vector<std::pair<int, int>> direct_pairs(int stages) {
  std::vector<std::pair<int, int>> pairs;
  for (int s = 0; s < stages; ++s) {
    const int next = (s + 1) % stages;
    if (next < s && stages == 2) break;  // 1 -> 0 is 0's pair already
    pairs.emplace_back(s, next);
    pairs.emplace_back(next, s);
  }
  return pairs;
}

}  // namespace

// A send in flight: the host tensor MPI reads from, kept until the request completes.
struct PipelineTransport::PendingSend {
  std::array<int64_t, kHeaderWords> header{};
  Tensor host;
  bool staged = false;  // `host` is one of host_buffers_, given back once sent
  // A step message of a CUDA tensor: the tensor its copy to `host` reads on the copy stream, kept
  // until finish_sends() (released there, on the thread and stream that made it).
  Tensor source;
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // header, data
  std::string description;
  int peer_world_rank = -1;
};

PipelineTransport::PipelineTransport(const Mesh& mesh, int world_rank, Route route, Device device)
    : route_(route), device_(device) {
  stages_ = mesh.pp();
  stage_ = mesh.coordinates(world_rank).pp;
  world_ranks_ = mesh.group_ranks(Axis::kPipeline, world_rank);
  if (stages_ == 1) return;
  // GPU stages' MPI waits never sleep: a message MPI moves in fragments advances only while it is
  // polled (parallel/comm/mpi_process_group.h).
  if (!device.is_cpu()) set_mpi_poll_pause_limit_us(0);
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
  if (route_ == Route::kDirect) make_direct_links(mesh, world_rank);
}

void PipelineTransport::make_direct_links(const Mesh& mesh, int world_rank) {
  // A group per ordered pair, split from the world: every rank of every pp group takes part in
  // each split, as a member of its own pp group's pair or alone (a group of one, dropped).
  const std::vector<std::pair<int, int>> pairs = direct_pairs(stages_);
  const int pipelines = mesh.world_size() / stages_;
  const int pipeline = mesh.group_index(Axis::kPipeline, world_rank);
  for (size_t p = 0; p < pairs.size(); ++p) {
    const auto [sender, receiver] = pairs[p];
    const bool member = stage_ == sender || stage_ == receiver;
    const int color = member ? pipeline * static_cast<int>(pairs.size()) + static_cast<int>(p)
                             : pipelines * static_cast<int>(pairs.size()) + world_rank;
    std::shared_ptr<ProcessGroup> group =
        make_split_process_group(color, str("pp ", sender, "->", receiver), device_);
    if (!member) continue;
    // Split groups order their ranks by world rank; the peer is whichever this rank is not.
    const int my_rank = group->world_ranks()[0] == world_rank ? 0 : 1;
    if (stage_ == sender) {
      direct_[receiver].sends = group;
      direct_[receiver].sends_peer_rank = 1 - my_rank;
    } else {
      direct_[sender].receives = group;
      direct_[sender].receives_peer_rank = 1 - my_rank;
    }
  }
  sends_block_host_ = device_.is_cpu() || gpu_collectives_through_host();
}

PipelineTransport::DirectLink& PipelineTransport::direct_link(int peer, const char* what) {
  auto found = direct_.find(peer);
  WEFT_CHECK(found != direct_.end(), "pipeline ", what, " between stages ", stage_, " and ", peer,
             ": parallel.pp_transport direct links neighbouring stages only (and the last with the first)");
  return found->second;
}

PipelineTransport::~PipelineTransport() {
  staged_sends_.reset();  // no queued send may reach the communicators freed below
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
  const bool direct = route_ == Route::kDirect && channel == Channel::kStep;
  auto pending = std::make_unique<PendingSend>();
  Tensor data;
  std::shared_ptr<cuda::Event> copied;  // a step message's copy to host memory, where it is queued
  if (direct) {
    WEFT_CHECK(tensor.device() == device_, "pipeline send from stage ", stage_, ": ", tensor.describe(),
               " is not on the transport's device ", device_.to_string());
    data = tensor.contiguous();
  } else {
    // Kept alive until sent. On the CPU it is the tensor itself (when contiguous): the step's
    // activations and gradients are never written after they are sent, and a caller that will
    // write its tensor sends a clone.
    if (tensor.device().is_cpu()) {
      pending->host = tensor.contiguous();
    } else if (channel == Channel::kStep) {
      // Copied on the buffers' copy stream; the MPI send waits for it on the queue's thread.
      pending->host = host_buffers_.acquire(tensor.shape(), tensor.dtype());
      pending->staged = true;
      pending->source = tensor.contiguous();
      copied = host_buffers_.download(pending->source, pending->host);
    } else {
      // The copy waits for the device (the host reads the buffer next).
      pending->host = host_buffers_.acquire(tensor.shape(), tensor.dtype());
      pending->host.copy_(tensor);
      pending->staged = true;
    }
    data = pending->host;
  }
  WEFT_CHECK(data.dim() <= kMaxDimensions, "pipeline send: ", tensor.describe(), " has more than ", kMaxDimensions,
             " dimensions");
  const auto dtype = std::find(std::begin(kHeaderDtypes), std::end(kHeaderDtypes), tensor.dtype());
  WEFT_CHECK(dtype != std::end(kHeaderDtypes), "pipeline send: ", tensor.describe(), " has a dtype no message carries");
  pending->header[0] = dtype - std::begin(kHeaderDtypes);
  pending->header[1] = data.dim();
  for (int64_t d = 0; d < data.dim(); ++d) pending->header[2 + d] = data.size(d);
  pending->header[kSequenceWord] = -1;
  pending->description = str("pipeline send of ", tensor.describe(), " from stage ", stage_, " to stage ", peer,
                             " (tag ", tag, ")");
  pending->peer_world_rank = world_ranks_[static_cast<size_t>(peer)];
  const int bytes = byte_count(data, "send");
  DirectLink* link = nullptr;
  if (direct) {
    std::lock_guard<std::mutex> guard(mutex_);
    link = &direct_link(peer, "send");
    pending->header[kSequenceWord] = link->sent++;
  }
  MPI_Comm comm = as_comm(communicator(channel));
  // The header, then (kHost) the data from host memory.
  auto post = [comm, peer, tag, bytes, direct](PendingSend& send) {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Isend(send.header.data(), kHeaderWords, MPI_INT64_T, peer, static_cast<int>(2 * tag), comm,
                             &send.requests[0]));
    if (!direct) {
      WEFT_MPI_CHECK(MPI_Isend(send.host.raw_data(), bytes, MPI_BYTE, peer, static_cast<int>(2 * tag + 1), comm,
                               &send.requests[1]));
    }
  };
  PendingSend& send = *pending;
  if (copied == nullptr) post(send);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    pending_.push_back(std::move(pending));
  }
  // `send` lives in pending_ until finish_sends(), which drains the queue before it looks.
  if (copied != nullptr) {
    const Device device = tensor.device();
    staged_sends_->post([post, &send, copied, device] {
      HostMessageBuffers::wait_until_copied(copied, device);
      post(send);
    });
  }
  // The data, in order on the direction's group. NCCL keeps `data` alive until its kernel is done
  // (the group's watchdog holds the handle), and wait() orders nothing new (the same stream); MPI
  // is done when send() returns, and wait() rethrows its failure.
  if (direct) link->sends->send(data, link->sends_peer_rank, direct_stream(device_))->wait();
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
  if (route_ == Route::kDirect && channel == Channel::kStep) {
    WEFT_CHECK(device == device_, description, ": asked for a tensor on ", device.to_string(),
               ", but the transport's device is ", device_.to_string());
    DirectLink* link = nullptr;
    int64_t expected = 0;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      link = &direct_link(peer, "receive");
      expected = link->received;
      if (header[kSequenceWord] == expected) ++link->received;
    }
    WEFT_CHECK(header[kSequenceWord] == expected, description, ": stage ", peer, " sent this message as its number ",
               header[kSequenceWord], " to stage ", stage_, ", but the next to arrive here is number ", expected,
               ": the stages post their messages in different orders, and parallel.pp_transport direct pairs "
               "messages by order, not by tag (use parallel.pp_transport host, which matches by tag)");
    Tensor data = Tensor::empty(shape, kHeaderDtypes[header[0]], device);
    link->receives->recv(data, link->receives_peer_rank, direct_stream(device))->wait();
    return data;
  }
  const bool staged = !device.is_cpu();
  Tensor host = staged ? host_buffers_.acquire(shape, kHeaderDtypes[header[0]])
                       : Tensor::empty(shape, kHeaderDtypes[header[0]], Device::cpu());
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
  if (!staged) return host;
  // Straight from the page-locked buffer, on the receiving stream; the buffer serves another
  // message once that copy has completed.
  Tensor on_device = Tensor::empty(shape, kHeaderDtypes[header[0]], device);
  host_buffers_.upload_and_release(host, on_device);
  return on_device;
}

void PipelineTransport::finish_sends() {
  // Every queued send handed to MPI first (their requests are written on the queue's thread).
  staged_sends_->drain();
  std::vector<std::unique_ptr<PendingSend>> sends;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    sends.swap(pending_);
  }
  for (const std::unique_ptr<PendingSend>& send : sends) {
    for (MPI_Request& request : send->requests) {
      if (request != MPI_REQUEST_NULL) wait_for_mpi_request(request, send->description, {send->peer_world_rank});
    }
    if (send->staged) host_buffers_.release(send->host);
  }
}

}  // namespace weft
