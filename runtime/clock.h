// clock_ms(): the one clock that every step timing is read on.
//
// The executor's node times, the step timeline, and every collective's start and end (CPU comm
// threads, MPI and NCCL process groups, CUDA handles that convert their events to host time) read
// this clock, so compute and communication timings of one process compare directly.
//
// Invariants: milliseconds since the steady clock's epoch; monotonic, never adjusted, and
// meaningful only within one process (ranks do not share an epoch).
#pragma once

#include <chrono>

namespace weft {

inline double clock_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace weft
