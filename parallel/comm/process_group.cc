#include "parallel/comm/process_group.h"

#include "parallel/comm/host_staged_process_group.h"
#include "parallel/comm/local_process_group.h"
#include "parallel/mesh.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/error.h"

#if WEFT_HAVE_CUDA && WEFT_HAVE_NCCL
#include "parallel/comm/nccl_process_group.h"
#endif

namespace weft {

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum: return "sum";
    case Reduction::kAverage: return "average";
    case Reduction::kMax: return "max";
  }
  return "?";
}

std::string ProcessGroup::describe() const {
  std::string ranks;
  for (int rank : world_ranks()) ranks += str(ranks.empty() ? "" : ", ", rank);
  return str(name(), " (world ranks ", ranks, ")");
}

namespace {

// A group over `comm` (owned) for `device`.
std::shared_ptr<ProcessGroup> make_group_over(MPI_Comm comm, const std::string& name, std::vector<int> world_ranks,
                                              Device device) {
  if (device.is_cpu()) return std::make_shared<MpiProcessGroup>(comm, name, std::move(world_ranks));
  // A process with GPU ranks: its MPI waits poll without sleeping (mpi_process_group.h).
  set_mpi_poll_pause_limit_us(0);
  if (gpu_collectives_through_host()) {
    return std::make_shared<HostStagedProcessGroup>(std::make_shared<MpiProcessGroup>(comm, name, std::move(world_ranks)),
                                                    device);
  }
#if WEFT_HAVE_CUDA && WEFT_HAVE_NCCL
  return std::make_shared<NcclProcessGroup>(comm, name, std::move(world_ranks), device.index);
#else
  MPI_Comm_free(&comm);
  WEFT_FAIL("process group '", name, "' on ", device.to_string(),
            ": this build of weft has no NCCL (configure with CUDA and NCCL found), so groups of more than one "
            "rank run on the CPU only");
#endif
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(const Mesh& mesh, Axis axis, Device device) {
  const std::string name = axis_name(axis);
  if (mesh.size(axis) == 1) return make_local_process_group(device, name);
  WEFT_CHECK(mpi_is_active(), "process group '", name, "' of ", mesh.size(axis),
             " ranks needs MPI: create a weft::MpiEnvironment first and start the program with mpirun");
  const int world_rank = mpi_world_rank();
  WEFT_CHECK(mesh.world_size() == mpi_world_size(), "the mesh ", mesh.to_string(), " has ", mesh.world_size(),
             " ranks but MPI_COMM_WORLD has ", mpi_world_size());
  MPI_Comm comm = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mesh.group_index(axis, world_rank),
                                  mesh.coordinates(world_rank).along(axis), &comm));
    WEFT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  }
  return make_group_over(comm, name, mesh.group_ranks(axis, world_rank), device);
}

std::shared_ptr<ProcessGroup> make_world_process_group(Device device) {
  if (mpi_world_size() == 1) return make_local_process_group(device, "world");
  MPI_Comm comm = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    WEFT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  }
  return make_group_over(comm, "world", mpi_world_ranks(), device);
}

std::shared_ptr<ProcessGroup> make_split_process_group(int color, const std::string& name, Device device) {
  if (!mpi_is_active() || mpi_world_size() == 1) return make_local_process_group(device, name);
  const int size = mpi_world_size();
  std::vector<int> colors(static_cast<size_t>(size));
  MPI_Comm comm = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Allgather(&color, 1, MPI_INT, colors.data(), 1, MPI_INT, MPI_COMM_WORLD));
    WEFT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, mpi_world_rank(), &comm));
    WEFT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  }
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) {
    if (colors[static_cast<size_t>(r)] == color) ranks.push_back(r);
  }
  if (ranks.size() == 1) {
    MpiCallLock lock;
    MPI_Comm_free(&comm);
    return make_local_process_group(device, name);
  }
  return make_group_over(comm, name, std::move(ranks), device);
}

}  // namespace weft
