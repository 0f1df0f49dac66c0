// TensorParallelGroup: the tensor-parallel axis of the mesh and the stream its collectives run on.
//
// Every tensor-parallel op (parallel/tensor/ for the auto mode, parallel/manual/ for the manual one)
// takes one: `group` is the tp process group (the local group of one when tp = 1), `stream` the
// tp_comm stream (CPU: a communication thread; CUDA: a stream of the rank's device, `cuda_stream`,
// which the group orders after the caller's compute before each collective; the caller stream is
// valid too and runs collectives in line). A collective on `stream` that the compute waits for at
// once is the manual mode's way; the auto mode's ops start one, compute, then wait.
//
// Invariants: group->size() >= 1; every rank of the group runs the same ops in the same order
// (the collectives match by order).
#pragma once

#include <memory>

#include "parallel/comm/process_group.h"
#include "parallel/comm/traced_process_group.h"

namespace weft {

namespace cuda {
class Stream;
}  // namespace cuda

struct TensorParallelGroup {
  std::shared_ptr<ProcessGroup> group;
  CommStream stream;
  // The sequence-parallel collective matmuls (parallel/tensor/collective_matmul.h): 0 or size(), a
  // ring of size() chunks, each transfer under a chunk's matmul; 1, one collective, then one
  // matmul. The auto mode chooses by the cost model (parallel/cost/collective_matmul_choice.h).
  int ring_chunks = 0;
  // Where weft-train made the group (parallel/strategy.cc), `group` is a TracedProcessGroup telling
  // this recorder of its collectives and waits, so the strategy can put them in the step's timeline
  // (parallel/comm/traced_process_group.h); null elsewhere.
  std::shared_ptr<CollectiveRecorder> recorder;
  // CUDA: the stream `stream` names, owned here (null on the CPU and where `stream` is the caller's).
  std::shared_ptr<cuda::Stream> cuda_stream;

  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
};

}  // namespace weft
