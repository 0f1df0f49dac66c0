// The stop signal's flag and the step agreement's vote, without MPI: what the handler records, that
// the first signal restores the default actions, and that stop and save decode from any sum.
#include "launcher/stop_signal.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "launcher/step_agreement.h"

namespace weft {
namespace {

TEST(StopSignalTest, FirstSignalSetsTheFlagAndRestoresTheDefaultActions) {
  install_stop_signal_handlers();
  EXPECT_FALSE(stop_requested());
  EXPECT_EQ(stop_signal_name(), "");
  ASSERT_EQ(raise(SIGTERM), 0);  // handled: the test goes on
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal_name(), "SIGTERM");
  for (const int signal_number : {SIGTERM, SIGINT}) {
    struct sigaction action;
    ASSERT_EQ(sigaction(signal_number, nullptr, &action), 0);
    EXPECT_EQ(action.sa_handler, SIG_DFL) << "signal " << signal_number;
  }
}

TEST(StepAgreementTest, StopAndSaveDecodeFromTheSum) {
  for (const int ranks : {1, 2, 3, 8, 1024}) {
    for (int stopping = 0; stopping <= ranks; stopping += (ranks > 8 ? 511 : 1)) {
      for (const bool save_due : {false, true}) {
        // Rank 0 stops first, so the leader's vote holds both flags when stopping > 0.
        int64_t sum = 0;
        for (int rank = 0; rank < ranks; ++rank) {
          sum += step_agreement_vote(rank < stopping, save_due, /*leader=*/rank == 0, ranks);
        }
        const StepAgreement agreement = step_agreement_from_sum(sum, ranks);
        EXPECT_EQ(agreement.stop, stopping > 0) << ranks << " ranks, " << stopping << " stopping";
        EXPECT_EQ(agreement.save, save_due) << ranks << " ranks, " << stopping << " stopping";
      }
    }
  }
}

TEST(StepAgreementTest, OnlyTheLeadersClockCounts) {
  const StepAgreement agreement = step_agreement_from_sum(step_agreement_vote(false, true, false, 1), 1);
  EXPECT_FALSE(agreement.save);
}

}  // namespace
}  // namespace weft
