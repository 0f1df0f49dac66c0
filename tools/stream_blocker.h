// block_stream: holds a stream busy for a while, so that the calls a benchmark queues behind it all
// wait in the stream before the first one runs. Timed that way, a kernel shorter than its host-side
// launch cannot be starved by the host: the events measure the GPU, not the launch rate.
#pragma once

#include <cuda_runtime.h>

namespace weft::tools {

// Enqueues on `stream` one single-thread kernel that spins on the GPU's global timer for
// `microseconds`, then returns at once (the host does not wait for it).
void block_stream(cudaStream_t stream, double microseconds);

}  // namespace weft::tools
