// UpdateOverlap: the optimizer's update of step k beside the forward of step k + 1, on CUDA.
//
// The update cannot start before the whole backward has ended (clipping needs the norm of every
// gradient), and AdamW's pass over the weights and their state is memory-bound work that leaves
// the tensor cores idle: 3% of GPT-2 124M's step, 4% of Llama 1B's, 7% of the 1.3B shape's at batch
// 8 (docs/performance.md). So the update runs on a stream of its own, one launch per model segment
// in forward order (Optimizer::split_updates), and the next step's forward of segment s waits only
// for the launches up to segment s's: the block forwards run while the blocks above them update.
//
// Invariants:
// - Part s holds the parameters whose first reader is segment s (the lowest segment that names
//   them; a parameter no segment names is part 0). Segment s reads only parts <= s, and the parts
//   are issued in order on one stream, so waiting for part s's event covers all it reads.
// - The next step writes a gradient only in a backward, which follows its segment's forward, so
//   the update has read it by then; the last segment waits for the last part, so the compute stream
//   has passed the whole update before the next update is issued.
// - What the update stream reads and the compute stream made (the guard, the clip factor) is freed
//   with the update stream current (run()): the caching allocator then reuses it only on the update
//   stream, after that stream's work (runtime/cuda/caching_allocator.h).
// - join(): the compute stream waits for the last update, for work that reads the parameters or the
//   optimizer's state outside a step (evaluation, checkpoints, the end of a run).
// On the CPU (and in builds without CUDA) it is never made: the update runs inside the step's
// issue there, so there is nothing to overlap.
#pragma once

#include <functional>
#include <memory>

#include "runtime/device.h"

namespace weft {

class UpdateOverlap {
 public:
  // Whether `device` can overlap (a CUDA device in a CUDA build).
  static bool available(const Device& device);
  // `parts`: the number of model segments (the optimizer's update parts).
  UpdateOverlap(const Device& device, int parts);
  // Waits for the update stream's work, then destroys it.
  ~UpdateOverlap();
  UpdateOverlap(const UpdateOverlap&) = delete;
  UpdateOverlap& operator=(const UpdateOverlap&) = delete;

  // Runs `update` (which issues the optimizer's step) with the update stream current, after the
  // compute stream's work so far. Called with the compute stream current.
  void run(const std::function<void()>& update);
  // UpdateParts::after_part: marks the end of part `part`'s launches on the update stream.
  void part_done(int part);
  // Before the first forward of segment `segment` in a step, compute stream current: waits for the
  // parts of the last update that it reads. Nothing before the first update.
  void before_forward(int segment);
  // The compute stream waits for the whole of the last update.
  void join();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace weft
