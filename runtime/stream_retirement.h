// Stream retirement: how per-stream caches learn that a device stream weft owned is gone.
//
// Caches of state per device stream (the caching allocator's pools, cuBLASLt workspaces, NCCL
// communicators) must not key by the stream's handle: CUDA hands a destroyed stream's handle out
// again, so a new stream would find the old stream's blocks, workspace or communicator. That is a
// data race for blocks and workspaces (the old stream's work may still run), and for NCCL a hang:
// one rank reuses a communicator while another creates one, collectively, alone. They key by a
// StreamKey instead, whose id (cudaStreamGetId: unique for the life of the process) is never
// handed out twice, and they listen here to drop what they hold for a stream when weft destroys it.
//
// Invariants:
// - The owner announces a stream after every piece of work queued on it has finished and before
//   it destroys it (cuda::Stream's destructor synchronizes first), so a listener may free or reuse
//   what the stream used without ordering it after the stream.
// - Listeners run on the announcing thread, in the order they were added, with the registry's
//   (recursive) lock held, so remove_stream_retired_listener never returns while its listener is
//   running and a listener may itself retire a stream. A listener must not throw.
// - Streams weft did not create (a CUDA stream handed to CommStream::cuda by a user) are never
//   announced: their entries stay, unreachable by any later stream, until their cache goes.
//
// CPU-only code (no CUDA header), so that the registry is built and tested in every build.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace weft {

// A device stream for the life of the process: its device and its process-unique id.
struct StreamKey {
  int device = 0;
  uint64_t id = 0;
  auto operator<=>(const StreamKey&) const = default;
};

using StreamRetiredListener = std::function<void(const StreamKey& stream)>;

// Adds `listener`; returns an id for remove_stream_retired_listener.
int add_stream_retired_listener(StreamRetiredListener listener);
// Removes a listener; once this returns it is not running and will not run again.
void remove_stream_retired_listener(int id);
// Calls every listener with `stream` (see the invariants for when the owner may call it).
void announce_stream_retired(const StreamKey& stream);

}  // namespace weft
