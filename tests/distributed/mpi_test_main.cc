// main() of the distributed test programs: starts MPI, runs every test on every rank, and prints
// rank 0's report only; another rank prints just its failures, each prefixed "rank R:". The exit
// status is non-zero on every rank when a test failed on any rank.
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/comm/mpi_environment.h"

namespace {

// Prints failed assertions and failed tests of a rank other than 0.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed()) std::fprintf(stderr, "rank %d: [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  if (mpi.world_rank() != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(mpi.world_rank()));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed && mpi.world_rank() == 0) std::fprintf(stderr, "a test failed on another rank\n");
  return any_failed;
}
