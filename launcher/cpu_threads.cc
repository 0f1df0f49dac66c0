// share_cpu_cores_between_ranks (cpu_threads.h).
#include "launcher/cpu_threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_format.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/thread_pool.h"

namespace weft {

std::string share_cpu_cores_between_ranks() {
  const MpiEnvironment* mpi = MpiEnvironment::current();
  const int ranks_on_host = mpi == nullptr ? 1 : std::max(1, mpi->local_size());
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  // A rank that mpirun bound to some of the cores keeps them all; ranks that each see every core
  // split them.
  const int all_cores = static_cast<int>(std::thread::hardware_concurrency());
  const int share = cores < all_cores ? std::max(1, cores) : std::max(1, cores / ranks_on_host);
  const bool pool_from_environment = std::getenv("OMP_NUM_THREADS") != nullptr;
  if (!pool_from_environment) cpu::set_thread_count(share);
  if (ranks_on_host > 1 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    // Looked up at run time: the BLAS linked may be another (Debian's alternatives), without it.
    using SetThreads = void (*)(int);
    auto set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    if (set_threads != nullptr) set_threads(share);
  }
  return absl::StrFormat("cpu: %d thread(s) per rank%s (%d rank(s) on this host, %d usable core(s) each); f32 "
                         "matmul by %s; OMP_NUM_THREADS overrides",
                         cpu::thread_count(), pool_from_environment ? " from OMP_NUM_THREADS" : "", ranks_on_host,
                         cores, cpu::f32_gemm_library());
}

}  // namespace weft
