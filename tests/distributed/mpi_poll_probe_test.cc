// The MPI poll probe (parallel/comm/mpi_poll_probe.h) under mpirun: it measures once, every rank
// takes the same choice and the process's pause limit follows it (or WEFT_MPI_POLL_PAUSE_US); its
// rule keeps the sleeps unless they clearly stall. WEFT_EXPECT_MPI_POLL=poll|sleep asserts the
// choice itself, for launches whose MPI is known (tests/CMakeLists.txt: shared memory without
// single copy, where the sleeps stall a 1 MB all-reduce twentyfold, must poll).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_poll_probe.h"
#include "parallel/comm/mpi_process_group.h"

namespace weft {
namespace {

TEST(MpiPollProbe, EveryRankTakesTheSameChoiceOnce) {
  const MpiPollChoice choice = choose_mpi_poll_pause();
  ASSERT_TRUE(choice.measured) << "a world of " << mpi_world_size() << " ranks is measured";
  EXPECT_GT(choice.sleeping_ms, 0.0);
  EXPECT_GT(choice.polling_ms, 0.0);
  EXPECT_EQ(choice.pause_limit_us, mpi_poll_pause_limit_us());

  const char* configured = std::getenv("WEFT_MPI_POLL_PAUSE_US");
  if (configured != nullptr && *configured != '\0') {
    int64_t microseconds = -1;
    ASSERT_TRUE(absl::SimpleAtoi(configured, &microseconds));
    EXPECT_TRUE(choice.from_environment);
    EXPECT_EQ(choice.pause_limit_us, microseconds) << "the environment's figure wins";
  } else {
    EXPECT_FALSE(choice.from_environment);
    EXPECT_EQ(choice.pause_limit_us, polling_wins(choice.sleeping_ms, choice.polling_ms) ? 0 : kCpuMpiPollPauseUs);
  }

  // The same figures on every rank (the slowest rank's), so the same choice.
  const double mine[3] = {choice.sleeping_ms, choice.polling_ms, static_cast<double>(choice.pause_limit_us)};
  std::vector<double> all(3 * static_cast<size_t>(mpi_world_size()));
  {
    MpiCallLock lock;
    ASSERT_EQ(MPI_Allgather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, MPI_COMM_WORLD), MPI_SUCCESS);
  }
  for (int rank = 0; rank < mpi_world_size(); ++rank) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(all[3 * static_cast<size_t>(rank) + i], mine[i]) << "rank " << rank;
  }

  // A second call (weft-compare's second trainer) measures nothing and returns the first result.
  const MpiPollChoice again = choose_mpi_poll_pause();
  EXPECT_EQ(again.sleeping_ms, choice.sleeping_ms);
  EXPECT_EQ(again.polling_ms, choice.polling_ms);
  EXPECT_EQ(again.pause_limit_us, choice.pause_limit_us);
  EXPECT_NE(choice.describe().find(choice.pause_limit_us == 0 ? "poll without sleeping" : "between polls"),
            std::string::npos)
      << choice.describe();

  const char* expected = std::getenv("WEFT_EXPECT_MPI_POLL");
  if (expected != nullptr) {
    const std::string want = expected;
    ASSERT_TRUE(want == "poll" || want == "sleep") << "WEFT_EXPECT_MPI_POLL=" << want;
    EXPECT_EQ(choice.pause_limit_us == 0, want == "poll") << choice.describe();
  }
}

// Figures the probe measured on the development machine (mpi_poll_probe.h): only the fragmented
// transport's stall is taken as one; a large ratio of tiny times is not.
TEST(MpiPollProbe, PollsOnlyWhereSleepsClearlyStall) {
  EXPECT_TRUE(polling_wins(7.2, 0.35));    // shared memory without single copy
  EXPECT_FALSE(polling_wins(0.93, 0.48));  // single-copy shared memory
  EXPECT_FALSE(polling_wins(2.7, 0.69));   // TCP
  EXPECT_FALSE(polling_wins(0.9, 0.05));   // 18x, but under 1 ms: a few sleeps
  EXPECT_FALSE(polling_wins(8.0, 1.0));    // 8x exactly is not over 8x
  EXPECT_TRUE(polling_wins(9.0, 1.0));
}

}  // namespace
}  // namespace weft
