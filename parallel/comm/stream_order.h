// Ordering a collective's CUDA stream after the caller's compute.
//
// A collective given a CUDA stream other than the calling thread's current one (the tensor-parallel
// group's tp_comm stream) must still see everything the caller queued before the call: its inputs
// were produced there. order_after_current_stream makes that stream wait, on the device, for the
// work queued so far on the caller's current stream of its device (an event recorded there and
// waited for; the host never blocks). It is what the executor does between its own streams.
#pragma once

#include "parallel/comm/process_group.h"

namespace weft {

// Nothing to do for the caller stream, a CommStream::cuda(nullptr, device) or the current stream
// itself (the collective runs in line with the compute), nor for a CPU stream (on the CPU the
// caller's work is done when it calls).
void order_after_current_stream(const CommStream& stream);

// True where a collective on `stream` runs on the calling thread's current CUDA stream of `device`:
// the compute stream waits for all of it.
bool runs_on_current_stream(const CommStream& stream, Device device);

}  // namespace weft
