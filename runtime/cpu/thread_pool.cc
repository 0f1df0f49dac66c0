// The pool size of thread_pool.h, shared by every thread of the process.
#include "runtime/cpu/thread_pool.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

namespace weft::cpu {
namespace {

std::atomic<int> configured_threads{0};  // 0: not set yet

// The number in environment variable `name`, or 0 when it is unset or not a positive number.
int positive_environment_number(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && value > 0 && value < 1 << 20 ? static_cast<int>(value) : 0;
}

// Before anyone sets the size: OMP_NUM_THREADS when given, else the cores this process may use
// shared among the ranks mpirun started on this host (Open MPI and MPICH say how many in the
// environment), so that test programs and tools under mpirun do not oversubscribe the cores either.
int default_thread_count() {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return omp_get_max_threads();
  int ranks_on_host = positive_environment_number("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (ranks_on_host == 0) ranks_on_host = positive_environment_number("MPI_LOCALNRANKS");
  return cores_per_rank(std::max(1, ranks_on_host));
}

}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

int cores_per_rank(int ranks_on_host) {
  const int cores = usable_cores();
  // A process mpirun bound to some of the cores keeps them all; ranks that each see every core
  // split them.
  if (cores < static_cast<int>(std::thread::hardware_concurrency())) return cores;
  return std::max(1, cores / std::max(1, ranks_on_host));
}

void set_thread_count(int threads) {
  configured_threads.store(std::max(threads, 1));
  omp_set_num_threads(std::max(threads, 1));
}

int thread_count() {
  int configured = configured_threads.load(std::memory_order_relaxed);
  if (configured == 0) {
    int expected = 0;
    configured_threads.compare_exchange_strong(expected, default_thread_count());
    configured = configured_threads.load();
  }
  return configured;
}

}  // namespace weft::cpu
