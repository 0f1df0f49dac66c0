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
// CUDA tensors travel through host memory: the transport copies them to the host before sending
// and to the device after receiving. (NCCL's own send/recv is the multi-GPU issue's to add; what
// it would need of the plans is in docs/architecture.md, "Pipelines on GPUs".)
//
// Thread safety: post_send, receive and finish_sends may be called from several threads at once
// (the executor's compute and p2p threads).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "parallel/mesh.h"
#include "runtime/tensor.h"

namespace weft {

class PipelineTransport {
 public:
  enum class Channel : uint8_t { kStep, kControl };

  // The transport of `world_rank`'s pp group. Collective over the world (every rank makes its
  // transport in the same order); needs MPI when mesh.pp() > 1.
  PipelineTransport(const Mesh& mesh, int world_rank);
  ~PipelineTransport();
  PipelineTransport(const PipelineTransport&) = delete;
  PipelineTransport& operator=(const PipelineTransport&) = delete;

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  // The largest tag a message may carry (half of MPI_TAG_UB, which is at least 32767: each message
  // is a header and the data).
  int64_t max_tag() const { return max_tag_; }

  // Sends `tensor` (contiguous or not; any device) to stage `peer` under `tag`, without waiting.
  // The caller must not write `tensor` until finish_sends() (send a clone otherwise).
  void post_send(const Tensor& tensor, int peer, int64_t tag, Channel channel = Channel::kStep);
  // Receives the message `tag` from stage `peer` as a new tensor (the sent dtype and shape) on
  // `device`. Blocks.
  Tensor receive(Device device, int peer, int64_t tag, Channel channel = Channel::kStep);
  // Blocks until every send posted so far has completed (within the deadline).
  void finish_sends();

 private:
  struct PendingSend;
  void* communicator(Channel channel) const;  // MPI_Comm

  int stage_ = 0;
  int stages_ = 1;
  int64_t max_tag_ = 16383;
  std::vector<int> world_ranks_;   // per stage
  void* step_comm_ = nullptr;      // MPI_Comm, as void* to keep mpi.h out of this header
  void* control_comm_ = nullptr;
  std::mutex mutex_;
  std::vector<std::unique_ptr<PendingSend>> pending_;
};

}  // namespace weft
