// CPU threads per rank. weft's CPU kernels and oneDNN's GEMMs share one OpenMP pool
// (runtime/cpu/parallel_for.h); several ranks on one host share its cores, so each rank's pool gets
// its share of them instead of a thread per core (which, times the ranks, oversubscribes the cores:
// idle pool threads spin while they wait, and a 4-rank run on 2 cores ran about 1.5x slower;
// docs/performance.md). OpenBLAS (f64 GEMMs, and f32 in builds without oneDNN) runs on the calling
// thread (runtime/cpu/gemm.cc), so its pool never competes with this one. OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS, when set, win.
#pragma once

#include <string>

namespace weft {

// Sets the pool to this process's usable cores when it runs alone on the host or mpirun bound it
// to some of them, else to max(1, cores / ranks on the host) (MpiEnvironment's local size). Returns a
// line for the log saying what it chose.
std::string share_cpu_cores_between_ranks();

}  // namespace weft
