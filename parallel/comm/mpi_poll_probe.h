// The poll probe: how CPU ranks wait for MPI, measured on the world's own MPI once per process.
//
// weft waits for every MPI operation by polling MPI_Test (wait_for_mpi_request). Between polls CPU
// ranks sleep, backing off to 200 us, so that a waiting comm thread leaves the cores to compute; on
// Open MPI's single-copy shared memory that costs the transfer little, and polling without sleeping
// made 2-rank data-parallel steps slower (145-157 ms against 169-197 ms, docs/performance.md). But an
// MPI that moves a large message in fragments (shared memory without a single-copy mechanism, as on
// the H200 machine or in containers that forbid it) advances it only while polled: there the sleeps
// held a 1 MB all-reduce to 0.16 GB/s against 4.6 GB/s, and the same steps ran 181-207 ms against
// 131-162 ms. Neither setting is right everywhere, so the probe times a 1 MB all-reduce over the
// world both ways and keeps the sleeps unless they stall it (polling_wins).
//
// Invariants: collective over MPI_COMM_WORLD (every rank calls it at the same point); it measures
// once per process and later calls return the first result (weft-compare builds two trainers);
// every rank takes the same choice (each figure is the slowest rank's); WEFT_MPI_POLL_PAUSE_US, when
// set, wins, and the probe still runs, so ranks launched with and without it stay in step. Without
// MPI, or in a world of one, nothing is measured and nothing changes.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

struct MpiPollChoice {
  bool measured = false;     // false: no MPI or a world of one
  double sleeping_ms = 0.0;  // a 1 MB all-reduce, sleeping up to kCpuMpiPollPauseUs between polls
  double polling_ms = 0.0;   // the same, polling without sleeping
  int64_t pause_limit_us = 0;  // the limit now in force (mpi_poll_pause_limit_us)
  bool from_environment = false;  // WEFT_MPI_POLL_PAUSE_US set it
  std::string describe() const;   // a line for the run's log
};

// Polling without sleeping wins where sleeping took over 8x as long and at least 1 ms more (more
// than a few sleeps can add). Measured by the probe on the development machine: shared memory
// without single-copy 22x; single-copy shared memory about 2x; TCP about 4x, where the two ways ran
// 2-rank steps equally fast.
bool polling_wins(double sleeping_ms, double polling_ms);

// Measures (the first time), sets the process's poll pause limit from the result (unless
// WEFT_MPI_POLL_PAUSE_US is set) and returns what it found.
MpiPollChoice choose_mpi_poll_pause();

}  // namespace weft
