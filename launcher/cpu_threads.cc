// share_cpu_cores_between_ranks (cpu_threads.h).
#include "launcher/cpu_threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_format.h"
#include "parallel/comm/mpi_environment.h"

namespace weft {

std::string share_cpu_cores_between_ranks() {
  const MpiEnvironment* mpi = MpiEnvironment::current();
  if (mpi == nullptr || mpi->local_size() <= 1 || std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return "";
  // Looked up at run time: the BLAS linked may be another (Debian's alternatives), without it.
  using SetThreads = void (*)(int);
  auto set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_threads == nullptr) return "";
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  // A rank that mpirun bound to some of the cores keeps them all; ranks that each see every core
  // split them.
  const int all_cores = static_cast<int>(std::thread::hardware_concurrency());
  const int chosen = cores < all_cores ? std::max(1, cores) : std::max(1, cores / mpi->local_size());
  set_threads(chosen);
  return absl::StrFormat("cpu: %d OpenBLAS thread(s) per rank (%d ranks on this host, %d usable core(s) each; "
                         "OPENBLAS_NUM_THREADS overrides)",
                         chosen, mpi->local_size(), cores);
}

}  // namespace weft
