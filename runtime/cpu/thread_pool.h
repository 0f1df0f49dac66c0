// The size of the CPU backend's thread pool (OpenMP's, shared by weft's kernels through
// parallel_for.h and by oneDNN's GEMMs): one setting for every thread of the process. Plain
// declarations, so that code built without OpenMP (the launcher) can set and read it.
#pragma once

namespace weft::cpu {

// The cores this process may run on (its affinity mask), at least 1.
int usable_cores();

// The pool size for one of `ranks_on_host` ranks sharing this host: all usable cores when mpirun
// bound the process to some of them (or it runs alone), else an equal share, at least 1.
int cores_per_rank(int ranks_on_host);

// Sets the pool's size for every thread of the process (OpenMP's own setting is per calling thread:
// a kernel or GEMM run from another thread would otherwise use one thread per core). Called once
// at start-up (launcher/cpu_threads.h gives each rank its share of the cores).
void set_thread_count(int threads);

// Threads the next parallel region may use: what set_thread_count set; before that, OMP_NUM_THREADS
// when given, else the usable cores divided among the ranks mpirun started on this host
// (OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS), at least 1.
int thread_count();

}  // namespace weft::cpu
