// Weight gradients on a stream of their own: one process's step on one GPU runs each segment's
// weight-gradient products beside the next segment's input gradients.
//
// A segment's backward defers its linears' weight gradients (runtime/autograd/
// deferred_weight_gradients.h, with BiasGradients::kWithInputGradients: the bias sums still come
// with dX's product or from the norms, as without a deferral). When the backward has queued its
// input gradients, launch() queues the deferred products on a second CUDA stream after everything
// the compute stream holds so far, while the compute stream goes on to the segment below: the
// products no later input gradient waits for then fill what the critical path leaves idle (the
// tails of its waves, the memory-bound norms, attention's small kernels).
//
// Invariants:
// - Every deferred product reads tensors the compute stream wrote and accumulates into a
//   parameter's .grad. The second stream waits, on the device, for the compute stream's work so
//   far before each launch; the compute stream waits for the second stream (join()) before any
//   segment whose parameters a launched segment's also are (a tied embedding), at the end of each
//   micro-batch's backward (so before the optimizer and the next micro-batch's accumulation), and
//   before the launch that is two segments old is released (retire_before()).
// - The tensors a launched item owns (dY, the layer's input rows) are freed only after the
//   compute stream has waited for that launch, with the compute stream current, so that their
//   memory goes back to the compute stream's cache (runtime/cuda/caching_allocator.h) and is never
//   handed out while the product may still read it. They are held about one segment longer than
//   without the overlap.
// - The items run on the host thread of the backward, in the order they were deferred: each
//   parameter's AccumulateGrad calls (and lazy zeroing) keep the host order an undeferred backward
//   has, and the device runs them in that order because of the waits above. The gradients are
//   bitwise those of the undeferred backward (the same kernels on the same inputs).
// - On the CPU (no second stream) launch() runs the items at once: the same deferral and the same
//   bits, with nothing overlapped; tests use it there.
//
// WEFT_WEIGHT_GRADIENT_STREAM picks it for one-GPU training (StrategyOptions::weight_gradient_stream
// overrides it): "1" on, "0" or unset off; any other value is reported on stderr and taken as off.
// The data-parallel strategy uses it only with one process and no collectives (no reducer, no
// tensor or pipeline parallelism), where no grad-ready hook waits on the gradients' stream.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/device.h"

namespace weft {

// Whether WEFT_WEIGHT_GRADIENT_STREAM asks for the overlap (read once per process).
bool weight_gradient_stream_setting();
// Deferred items launch() has run in this process, on either device (tests: that the overlap ran).
int64_t weight_gradient_items_launched_for_testing();

class WeightGradientOverlap {
 public:
  // segment_parameters: per segment, the names of the parameters it reads (ModelSegment).
  WeightGradientOverlap(Device device, std::vector<std::vector<std::string>> segment_parameters);
  // Waits for the second stream's work and releases what it holds.
  ~WeightGradientOverlap();
  WeightGradientOverlap(const WeightGradientOverlap&) = delete;
  WeightGradientOverlap& operator=(const WeightGradientOverlap&) = delete;

  // Before segment `segment`'s backward: joins where a launched segment shares a parameter with it,
  // else makes the compute stream wait for the launches older than the newest one and releases them.
  void before_backward(int segment);
  // The deferral target for segment `segment`'s backward (kWithInputGradients).
  autograd::DeferredWeightGradients& deferral();
  // After the backward: queues the deferred items on the second stream (on the CPU, runs them).
  void launch(int segment);
  // Makes the compute stream wait for every launch and releases what they hold.
  void join();

  // Launches whose tensors are still held (tests).
  size_t pending() const { return pending_.size(); }

 private:
  struct Launch;
  void retire(size_t count);

  Device device_;
  std::vector<std::set<std::string>> segment_parameters_;
  autograd::DeferredWeightGradients deferral_{autograd::DeferredWeightGradients::BiasGradients::kWithInputGradients};
  std::vector<std::unique_ptr<Launch>> pending_;  // oldest first
  std::vector<std::unique_ptr<Launch>> spare_;    // retired, their events reusable
  struct DeviceStreams;
  std::unique_ptr<DeviceStreams> streams_;        // CUDA only
};

}  // namespace weft
