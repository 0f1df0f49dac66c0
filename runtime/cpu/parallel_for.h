// The CPU backend's thread pool: OpenMP, shared with oneDNN's GEMMs (one pool for the process, not
// one per library). Kernels split independent work items (rows, heads) with parallel_for.
//
// Invariant: every item is computed by exactly one thread, in the same order of operations as the
// serial loop, so a kernel's results do not depend on the thread count (the f64 gradient checks
// and the bitwise CPU comparisons between configurations rely on it). Reductions across items
// (a sum over rows) must not be split this way. Small calls stay on the calling thread: a parallel
// region costs a few microseconds, more than a row of a small model takes. Asynchronous signals are
// held back on the pool's threads while a region runs (deferred_signals.h says why). An exception
// thrown by a chunk reaches the caller, as from the serial loop.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#include "runtime/cpu/deferred_signals.h"
#include "runtime/cpu/thread_pool.h"

namespace weft::cpu {

// Calls body(begin, end) over [0, count) in contiguous chunks, one per thread, when count *
// work_per_item is worth a parallel region (at least about 32k operations per thread); else calls
// body(0, count) on this thread. Chunks are balanced statically, so the same count and thread
// count always give the same split.
template <class Body>
void parallel_for(int64_t count, int64_t work_per_item, Body&& body) {
  if (count <= 0) return;
  constexpr int64_t kMinimumWorkPerThread = 32 * 1024;
  const int64_t total_work = count * std::max<int64_t>(work_per_item, 1);
  const int64_t useful_threads =
      std::min<int64_t>({static_cast<int64_t>(thread_count()), count, total_work / kMinimumWorkPerThread});
  if (useful_threads <= 1 || omp_in_parallel() != 0) {
    body(int64_t{0}, count);
    return;
  }
  // The region's threads may run oneDNN's GEMMs; its workers are created here and keep the mask.
  const DeferredSignals deferred;
  // An exception may not leave an OpenMP region (the program would terminate): the first one thrown
  // is kept and rethrown on the calling thread once every chunk has finished.
  std::exception_ptr first_error;
  std::atomic_flag error_taken = ATOMIC_FLAG_INIT;
#pragma omp parallel num_threads(static_cast<int>(useful_threads))
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t begin = count * thread / threads, end = count * (thread + 1) / threads;
    try {
      if (begin < end) body(begin, end);
    } catch (...) {
      if (!error_taken.test_and_set()) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace weft::cpu
