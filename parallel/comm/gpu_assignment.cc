#include "parallel/comm/gpu_assignment.h"

#include <mpi.h>

#include <cstdio>
#include <map>
#include <set>

#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

#if defined(WEFT_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace weft {

int gpu_index_for_local_rank(int local_rank, int visible_gpus) {
  WEFT_CHECK(visible_gpus > 0, "gpu_index_for_local_rank: no visible GPU");
  return local_rank % visible_gpus;
}

std::vector<int> assign_gpus_to_local_ranks(const std::vector<VisibleGpus>& visible_of_local_rank,
                                            const std::string& host, const GpuAssignmentOptions& options) {
  const int ranks = static_cast<int>(visible_of_local_rank.size());
  std::set<std::string> host_gpus;  // every physical GPU some rank of the host sees
  for (const VisibleGpus& visible : visible_of_local_rank) host_gpus.insert(visible.begin(), visible.end());
  const int gpus = static_cast<int>(host_gpus.size());
  std::vector<int> indices(static_cast<size_t>(ranks));
  std::map<std::string, int> taken_by;  // physical GPU -> the first local rank that took it
  for (int rank = 0; rank < ranks; ++rank) {
    const VisibleGpus& visible = visible_of_local_rank[static_cast<size_t>(rank)];
    WEFT_CHECK(!visible.empty(), "host '", host, "': local rank ", rank,
               " sees no CUDA device (train.device: cuda); check CUDA_VISIBLE_DEVICES and, under Slurm, that the "
               "job asks for GPUs (--gpus-per-task=1 or --gpus-per-node)");
    WEFT_CHECK(options.device < static_cast<int>(visible.size()), "train.device: cuda:", options.device,
               ", but local rank ", rank, " of host '", host, "' sees ", visible.size(), " CUDA device",
               visible.size() == 1 ? "" : "s", " (0 to ", visible.size() - 1,
               "); name a device it sees, or set train.device: cuda to give each rank its own");
    const int index =
        options.device >= 0 ? options.device : gpu_index_for_local_rank(rank, static_cast<int>(visible.size()));
    indices[static_cast<size_t>(rank)] = index;
    const std::string& uuid = visible[static_cast<size_t>(index)];
    const auto [previous, inserted] = taken_by.emplace(uuid, rank);
    if (!inserted && options.sharing_allowed) continue;
    if (!inserted && options.device >= 0) {
      WEFT_FAIL("train.device: cuda:", options.device, " puts local ranks ", previous->second, " and ", rank,
                " of host '", host, "' on the same GPU ", uuid, ", which NCCL refuses (and which would halve each "
                "rank's memory): set train.device: cuda, and each rank takes a GPU of its own (visible device "
                "local_rank % visible devices); to test several ranks on one GPU, WEFT_GPU_COLLECTIVES=mpi runs the "
                "collectives through the host (tools/device/shared-gpu-pass)");
    }
    if (!inserted) {
      WEFT_FAIL("host '", host, "' runs ", ranks, " ranks but has ", gpus, " GPU", gpus == 1 ? "" : "s",
                " visible to them: local ranks ", previous->second, " and ", rank, " would share GPU ", uuid,
                " (each rank takes visible device local_rank % visible devices). Start at most one rank per GPU: "
                "mpirun -npernode ", gpus, " (or --map-by ppr:", gpus, ":node) with a hostfile of slots=", gpus,
                " per host; under Slurm srun --ntasks-per-node=", gpus,
                " --gpus-per-task=1 (or CUDA_VISIBLE_DEVICES set per rank to a GPU of its own)");
    }
  }
  return indices;
}

#if defined(WEFT_HAVE_CUDA)

namespace {

constexpr int kUuidBytes = 16;

std::string format_uuid(const unsigned char* bytes) {
  // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  std::string text = "GPU-";
  char hex[3];
  for (int i = 0; i < kUuidBytes; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    std::snprintf(hex, sizeof(hex), "%02x", bytes[i]);
    text += hex;
  }
  return text;
}

// The raw UUIDs of the GPUs this process sees, kUuidBytes each, in device order.
std::vector<unsigned char> visible_gpu_uuids() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: this rank sees none, which the assignment reports
    count = 0;
  }
  std::vector<unsigned char> uuids;
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties;
    const cudaError_t status = cudaGetDeviceProperties(&properties, device);
    WEFT_CHECK(status == cudaSuccess, "cudaGetDeviceProperties(", device, "): ", cudaGetErrorString(status));
    const auto* bytes = reinterpret_cast<const unsigned char*>(properties.uuid.bytes);
    uuids.insert(uuids.end(), bytes, bytes + kUuidBytes);
  }
  return uuids;
}

}  // namespace

int gpu_of_this_rank(const GpuAssignmentOptions& options) {
  const std::vector<unsigned char> mine = visible_gpu_uuids();
  std::vector<VisibleGpus> visible_of_local_rank;
  std::string host = "localhost";
  int local_rank = 0;
  if (!mpi_is_active()) {
    visible_of_local_rank.emplace_back();
    for (size_t at = 0; at < mine.size(); at += kUuidBytes) visible_of_local_rank[0].push_back(format_uuid(&mine[at]));
  } else {
    MpiCallLock lock;
    char name[MPI_MAX_PROCESSOR_NAME];
    int name_length = 0;
    WEFT_MPI_CHECK(MPI_Get_processor_name(name, &name_length));
    host.assign(name, static_cast<size_t>(name_length));
    int world_rank = 0;
    WEFT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_Comm node = MPI_COMM_NULL;
    WEFT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
    int local_size = 1;
    WEFT_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    WEFT_MPI_CHECK(MPI_Comm_size(node, &local_size));
    // Every rank's byte count, then every rank's bytes (ranks may see different numbers of GPUs).
    const int my_bytes = static_cast<int>(mine.size());
    std::vector<int> bytes(static_cast<size_t>(local_size));
    WEFT_MPI_CHECK(MPI_Allgather(&my_bytes, 1, MPI_INT, bytes.data(), 1, MPI_INT, node));
    std::vector<int> offsets(static_cast<size_t>(local_size), 0);
    for (int rank = 1; rank < local_size; ++rank) offsets[rank] = offsets[rank - 1] + bytes[rank - 1];
    std::vector<unsigned char> all(static_cast<size_t>(offsets.back() + bytes.back()) + 1);
    WEFT_MPI_CHECK(MPI_Allgatherv(mine.data(), my_bytes, MPI_UNSIGNED_CHAR, all.data(), bytes.data(),
                                  offsets.data(), MPI_UNSIGNED_CHAR, node));
    WEFT_MPI_CHECK(MPI_Comm_free(&node));
    visible_of_local_rank.resize(static_cast<size_t>(local_size));
    for (int rank = 0; rank < local_size; ++rank) {
      for (int at = 0; at < bytes[rank]; at += kUuidBytes) {
        visible_of_local_rank[rank].push_back(format_uuid(&all[static_cast<size_t>(offsets[rank] + at)]));
      }
    }
  }
  return assign_gpus_to_local_ranks(visible_of_local_rank, host, options)[static_cast<size_t>(local_rank)];
}

#else

int gpu_of_this_rank(const GpuAssignmentOptions&) {
  WEFT_FAIL("train.device: cuda, but weft was built without CUDA; rebuild with the CUDA toolkit installed "
            "(tools/build finds nvcc) or set train.device: cpu");
}

#endif

}  // namespace weft
