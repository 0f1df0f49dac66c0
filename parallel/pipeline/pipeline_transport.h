// PipelineTransport: activations and their gradients between pipeline stages, as tagged messages.
//
// Every rank has one transport over its pp group (the ranks that differ only in their pipeline
// coordinate; group rank = stage). A message is named by its peer stage and a tag (the step builder
// encodes direction, stage boundary and micro-batch in it), so sends and receives match whatever
// order each side posts them in:
//
//   post_send(tensor, stage + 1, tag)  // returns at once (MPI_Isend); the tensor is kept until sent
//   receive(device, stage - 1, tag)    // blocks until the message is in
//   finish_sends()                     // the step's end: every send posted so far has completed
//
// Sends never wait for their receiver, so whether a pipeline schedule can deadlock depends only on
// the order of its computations and receives, which the scheduler tests check for every schedule
// without MPI (tests/unit/pipeline_step_graph_test.cc). A receive that does not complete within
// WEFT_COMM_TIMEOUT_S seconds (default 60) ends the whole job naming the peer stage's world rank
// (parallel/comm/fault_handler.h), so a stage that died never leaves its neighbours hanging.
//
// Two channels, each its own communicator: the step's messages, and everything else (evaluation,
// the tied embedding's gradient, checkpoint gathers), so that their tags never meet.
//
// A message carries its dtype and shape (a small header sent before the data), so a stage needs
// to know nothing of its neighbours' layers: a custom segment may hand on any shape.
//
// Two routes for the step's data (parallel.pp_transport; the header and the control channel always
// go through MPI):
// - kHost (the default): the tensor itself as a tagged MPI message. CUDA tensors travel through
//   host memory: copied to the host before sending and to the device after receiving, staged in
//   page-locked buffers used again message after message (host_message_buffers.h: MPI and the
//   copies run several times faster in them than in memory allocated for each message). A step
//   message's copy to the host runs on a copy stream behind the work that wrote the tensor, and a
//   thread of the transport posts the MPI send once it is done (staged_send_queue.h), so post_send
//   neither waits for the device nor makes the caller's stream wait for the copy; the tensor is
//   kept until finish_sends(). Control messages are copied on the calling thread, as before.
// - kDirect: the tensor by the send/recv of a process group per direction between two stages (a
//   group for this stage's sends to a peer, another for the peer's sends to it): NCCL on GPUs,
//   device to device on the stream current at the call, never through the host; MPI on the CPU
//   (and through the host where CUDA ranks share a GPU, WEFT_GPU_COLLECTIVES=mpi). Such a send
//   waits for its receive (NCCL: on its stream; otherwise on the calling thread), and messages
//   pair in the order they are posted, not by tag. The auto mode's plans keep both rules (they
//   post every send to a peer from one list and every receive from it on another, in the peer's
//   order, and never deadlock under rendezvous: docs/architecture.md, "Pipelines on GPUs"); the
//   manual mode's do not (a stage's sends and receives share its compute list), so kDirect is for
//   the auto mode only (the config refuses it otherwise). Each header carries the message's
//   place in its direction's order, and a receive whose tag names a message out of that order
//   stops with an error instead of taking another message's data.
//   The direction groups are made with the transport; on NCCL each creates its communicator at
//   its first use on each side (the first send, on the sender's compute stream; the first
//   receive, on the receiver's p2p stream).
//
// Thread safety: post_send, receive and finish_sends may be called from several threads at once
// (the executor's compute and p2p threads). With kDirect, a direction's sends come from one thread
// and its receives from one thread (true of the step graph: sends on the compute list, receives on
// the p2p list).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/host_message_buffers.h"
#include "parallel/pipeline/staged_send_queue.h"
#include "runtime/tensor.h"

namespace weft {

class PipelineTransport {
 public:
  enum class Channel : uint8_t { kStep, kControl };
  enum class Route : uint8_t { kHost, kDirect };

  // The transport of `world_rank`'s pp group, for tensors on `device`. Collective over the world
  // (every rank makes its transport in the same order); needs MPI when mesh.pp() > 1.
  PipelineTransport(const Mesh& mesh, int world_rank, Route route = Route::kHost, Device device = Device::cpu());
  ~PipelineTransport();
  PipelineTransport(const PipelineTransport&) = delete;
  PipelineTransport& operator=(const PipelineTransport&) = delete;

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  // The largest tag a message may carry (half of MPI_TAG_UB, which is at least 32767: each message
  // is a header and the data).
  int64_t max_tag() const { return max_tag_; }
  Route route() const { return route_; }
  // Whether a step-channel send may wait on the calling thread for its receiver (kDirect outside
  // NCCL: MPI on the CPU, or CUDA ranks sharing a GPU through the host). The CUDA executor then
  // runs the send off its issuing thread (NodeSpec::blocks_host), as NCCL's send would wait on
  // the stream, not on the host.
  bool sends_block_host() const { return sends_block_host_; }

  // Sends `tensor` (contiguous or not; any device) to stage `peer` under `tag`. kHost (and every
  // kControl message): returns at once. kDirect: queued on the current stream (NCCL), or returns
  // once the receiver has it. The caller must not write `tensor` until finish_sends() (send a clone
  // otherwise).
  void post_send(const Tensor& tensor, int peer, int64_t tag, Channel channel = Channel::kStep);
  // Receives the message `tag` from stage `peer` as a new tensor (the sent dtype and shape) on
  // `device`. Blocks until the header is in; kDirect on NCCL queues the data's receive on the
  // current stream, and the tensor is ready in stream order.
  Tensor receive(Device device, int peer, int64_t tag, Channel channel = Channel::kStep);
  // Blocks until every send posted so far has completed (within the deadline).
  void finish_sends();

 private:
  struct PendingSend;
  // kDirect: the groups of this stage and one peer, and how many step messages each way so far.
  struct DirectLink {
    std::shared_ptr<ProcessGroup> sends;     // this stage -> peer
    std::shared_ptr<ProcessGroup> receives;  // peer -> this stage
    int sends_peer_rank = 1;                 // the peer's rank in `sends`
    int receives_peer_rank = 0;              // the peer's rank in `receives`
    int64_t sent = 0;
    int64_t received = 0;
  };
  void* communicator(Channel channel) const;  // MPI_Comm
  void make_direct_links(const Mesh& mesh, int world_rank);
  DirectLink& direct_link(int peer, const char* what);

  int stage_ = 0;
  int stages_ = 1;
  Route route_ = Route::kHost;
  Device device_ = Device::cpu();
  bool sends_block_host_ = false;
  std::map<int, DirectLink> direct_;  // by peer stage (kDirect); its counters under mutex_
  int64_t max_tag_ = 16383;
  std::vector<int> world_ranks_;   // per stage
  void* step_comm_ = nullptr;      // MPI_Comm, as void* to keep mpi.h out of this header
  void* control_comm_ = nullptr;
  std::mutex mutex_;
  std::vector<std::unique_ptr<PendingSend>> pending_;
  HostMessageBuffers host_buffers_;  // kHost's staging of CUDA tensors
  // kHost's step messages of CUDA tensors, handed to MPI once copied; stopped first on destruction
  // (its jobs post on the communicators above).
  std::unique_ptr<StagedSendQueue> staged_sends_ = std::make_unique<StagedSendQueue>();
};

}  // namespace weft
