// block_stream (stream_blocker.h): a one-thread kernel that spins on %globaltimer. The global timer
// counts nanoseconds whatever the SM clock, so the wait lasts as long as asked even on a GPU that
// clocks down, and one thread leaves every other SM free.
#include "tools/stream_blocker.h"

#include "runtime/cuda/cuda_check.h"

namespace weft::tools {
namespace {

__global__ void spin(long long nanoseconds) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void block_stream(cudaStream_t stream, double microseconds) {
  spin<<<1, 1, 0, stream>>>(static_cast<long long>(microseconds * 1000.0));
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace weft::tools
