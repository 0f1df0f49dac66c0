// The poll pause of MPI waits (parallel/comm/mpi_process_group.h): CPU ranks sleep up to 200 us
// between polls, processes with GPU ranks never sleep, and WEFT_MPI_POLL_PAUSE_US wins over both.
// (Its effect is measured, not asserted: docs/performance.md, 2026-12-05.)
#include <gtest/gtest.h>

#include <cstdlib>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/error.h"

namespace weft {
namespace {

TEST(MpiPollPause, CpuRanksSleepUntilAGpuProcessSaysNot) {
  ASSERT_EQ(std::getenv("WEFT_MPI_POLL_PAUSE_US"), nullptr) << "run without WEFT_MPI_POLL_PAUSE_US";
  EXPECT_EQ(mpi_poll_pause_limit_us(), 200);
  set_mpi_poll_pause_limit_us(0);
  EXPECT_EQ(mpi_poll_pause_limit_us(), 0);
  set_mpi_poll_pause_limit_us(-5);
  EXPECT_EQ(mpi_poll_pause_limit_us(), 0);
  set_mpi_poll_pause_limit_us(50);
  EXPECT_EQ(mpi_poll_pause_limit_us(), 50);
  // The environment's figure wins over what the process sets.
  setenv("WEFT_MPI_POLL_PAUSE_US", "7", 1);
  set_mpi_poll_pause_limit_us(0);
  EXPECT_EQ(mpi_poll_pause_limit_us(), 50);
  setenv("WEFT_MPI_POLL_PAUSE_US", "soon", 1);
  EXPECT_THROW(set_mpi_poll_pause_limit_us(0), Error);
  unsetenv("WEFT_MPI_POLL_PAUSE_US");
}

}  // namespace
}  // namespace weft
