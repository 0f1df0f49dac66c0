// CPU threads per rank: several ranks on one host share its cores, so each rank's OpenBLAS gets
// its share of them instead of a thread per core (which, times the ranks, oversubscribes the
// cores: OpenBLAS's threads spin while they wait, and a 4-rank run on 2 cores ran about 1.5x
// slower; docs/performance.md). weft's own CPU kernels are single-threaded; OpenBLAS is the only
// pool. OPENBLAS_NUM_THREADS, when set, wins.
#pragma once

#include <string>

namespace weft {

// When the host runs several ranks (MpiEnvironment's local size) and OPENBLAS_NUM_THREADS is unset,
// sets OpenBLAS's threads to this process's usable cores if mpirun bound it to some of them, else
// to max(1, cores / ranks on the host); a BLAS other than OpenBLAS is left alone. Returns a line for the log saying what it did ("" when it
// did nothing).
std::string share_cpu_cores_between_ranks();

}  // namespace weft
