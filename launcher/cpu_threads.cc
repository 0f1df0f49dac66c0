// share_cpu_cores_between_ranks (cpu_threads.h).
#include "launcher/cpu_threads.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "parallel/comm/mpi_environment.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/thread_pool.h"

namespace weft {

std::string share_cpu_cores_between_ranks() {
  const MpiEnvironment* mpi = MpiEnvironment::current();
  const int ranks_on_host = mpi == nullptr ? 1 : std::max(1, mpi->local_size());
  const int share = cpu::cores_per_rank(ranks_on_host);
  const bool pool_from_environment = std::getenv("OMP_NUM_THREADS") != nullptr;
  if (!pool_from_environment) cpu::set_thread_count(share);
  return absl::StrFormat("cpu: %d thread(s) per rank%s (%d rank(s) on this host, %d usable core(s) each); f32 "
                         "matmul by %s; OMP_NUM_THREADS overrides",
                         cpu::thread_count(), pool_from_environment ? " from OMP_NUM_THREADS" : "", ranks_on_host,
                         cpu::usable_cores(), cpu::f32_gemm_library());
}

}  // namespace weft
