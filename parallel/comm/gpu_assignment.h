// GPU assignment: which CUDA device each rank of a host uses, with any number of GPUs per host.
//
// The rule: a rank takes visible device local_rank % (devices it sees). That one rule covers the
// usual launches: mpirun -npernode G on hosts of G GPUs (every rank sees all G, rank r takes r),
// Slurm's --gpus-per-task=1 or a CUDA_VISIBLE_DEVICES per rank (every rank sees one GPU and takes
// device 0), and fewer ranks than GPUs. It goes wrong when a host runs more ranks than the GPUs
// they can tell apart: then two ranks would share one physical GPU, which NCCL refuses and which
// would halve each rank's memory. So the ranks of a host compare the UUIDs of the GPUs they picked
// (CUDA_VISIBLE_DEVICES renumbers devices per process; a UUID names the physical GPU), and every
// one of them stops with the same message saying how many ranks and GPUs the host has and how to
// launch instead.
//
// `train.device: cuda:N` (GpuAssignmentOptions::device) gives every rank visible device N instead,
// checked the same way: several ranks of a host on one GPU stop with a message unless the
// collectives go through the host (WEFT_GPU_COLLECTIVES=mpi: GpuAssignmentOptions::sharing_allowed,
// a test mode, parallel/comm/host_staged_process_group.h), where sharing is the point.
//
// assign_gpus_to_local_ranks is the rule, pure (unit-tested); gpu_of_this_rank runs it on what the
// ranks of this host see (CUDA and MPI), collective over the world.
#pragma once

#include <string>
#include <vector>

namespace weft {

// The UUIDs of the GPUs one rank sees, in CUDA's device order (after CUDA_VISIBLE_DEVICES), written
// like nvidia-smi's "GPU-8f1c2d3e-...".
using VisibleGpus = std::vector<std::string>;

// The visible device a rank takes: local_rank % visible_gpus (visible_gpus > 0).
int gpu_index_for_local_rank(int local_rank, int visible_gpus);

struct GpuAssignmentOptions {
  int device = -1;               // >= 0: every rank takes this visible device (train.device: cuda:N)
  bool sharing_allowed = false;  // ranks may share a physical GPU (collectives through the host)
};

// The device index of every rank of a host (indexed by local rank), from what each of them sees.
// Throws weft::Error naming `host` when a rank sees no GPU or not options.device, or when two ranks
// would take the same physical GPU and sharing is not allowed (then: how many ranks and GPUs the
// host has, which ranks collide, and the mpirun and Slurm options, or the train.device, that give
// each rank a GPU of its own).
std::vector<int> assign_gpus_to_local_ranks(const std::vector<VisibleGpus>& visible_of_local_rank,
                                            const std::string& host, const GpuAssignmentOptions& options = {});

// This rank's CUDA device index: asks CUDA for the UUIDs of the visible GPUs, gathers every rank's
// list within the host (MPI_COMM_TYPE_SHARED) and applies assign_gpus_to_local_ranks. Collective over
// the world (every rank calls it once, early); without MPI, a single process. Throws weft::Error in a
// build without CUDA.
int gpu_of_this_rank(const GpuAssignmentOptions& options = {});

}  // namespace weft
