// A training-loop stand-in for the fault tests: every rank all-reduces on a comm thread in a loop
// while its main thread computes; at iteration 5 rank 1 fails as the mode says:
//   raise  throws weft::Error, which main() reports as weft-train's main does (abort_all_if_distributed)
//   kill   SIGKILLs itself in the middle of the loop
//   stall  stops taking part (sleeps) while staying alive: the others' comm timeout must fire
// The others must all exit non-zero within the time limit, with a message naming the failure
// (tests/distributed/expect_failure.sh checks).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "parallel/comm/fault_handler.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "runtime/error.h"

namespace {

void train(const char* mode) {
  auto world = weft::make_world_process_group(weft::Device::cpu());
  weft::CommStream comm = weft::CommStream::cpu("dp-comm");
  weft::Tensor gradients = weft::Tensor::full({1 << 16}, 1.0, weft::kFloat32);
  for (int step = 0; step < 1000000; ++step) {
    if (step == 5 && world->rank() == 1) {
      if (std::strcmp(mode, "raise") == 0) WEFT_FAIL("injected failure at step ", step);
      if (std::strcmp(mode, "kill") == 0) raise(SIGKILL);
      if (std::strcmp(mode, "stall") == 0) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    weft::CollectiveHandlePtr handle = world->all_reduce(gradients, weft::Reduction::kAverage, comm);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // "compute"
    handle->wait();
  }
}

}  // namespace

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);
  const char* mode = argc > 1 ? argv[1] : "raise";
  try {
    train(mode);
  } catch (const std::exception& error) {
    // What weft-train's main does with an error that escapes the training loop.
    weft::abort_all_if_distributed(std::string("weft-train: error: ") + error.what());
    std::fprintf(stderr, "weft-train: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
